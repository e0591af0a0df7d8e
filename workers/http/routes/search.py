"""Search a user's long-term memory."""

# No `from __future__ import annotations`: FastAPI reads the annotations at run time.
from typing import Annotated

from fastapi import APIRouter, Query, Response

from memq.contracts.queries import Search, SearchMode, SearchResults
from memq.contracts.vocabulary import SearchRole
from memq.workers.http.params import query
from memq.workers.http.routes.common import BASE, Client, User, as_json

search_router = APIRouter(tags=["memory"])


@search_router.get(BASE + "/search", response_model=SearchResults)
async def search(
    client: Client,
    user: User,
    q: Annotated[str, query(Search, "query", "what to look for")],
    session: Annotated[str | None, Query(description="only this session")] = None,
    mode: Annotated[SearchMode, Query()] = "hybrid",
    k: Annotated[int, query(Search, "k")] = 10,
    authors: Annotated[list[str], Query(description="only these authors")] = [],  # noqa: B006
    roles: Annotated[list[SearchRole], Query()] = [],  # noqa: B006
    since: Annotated[float | None, Query(description="timestamp >= since")] = None,
    until: Annotated[float | None, Query(description="timestamp < until")] = None,
    alpha: Annotated[float | None, query(Search, "alpha")] = None,
    min_seq: Annotated[int | None, query(Search, "min_seq", "answer once this sequence is indexed")] = None,
) -> Response:
    """Search the user's long-term memory (all their sessions, or one), best first."""
    results = await client.search(
        user,
        q,
        session=session,
        mode=mode,
        k=k,
        authors=authors,
        roles=roles,
        since=since,
        until=until,
        alpha=alpha,
        min_seq=min_seq,
    )
    return as_json(results)
