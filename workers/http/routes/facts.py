"""What the fact worker knows about a user: facts, a profile, one fact's history."""

# No `from __future__ import annotations`: FastAPI reads the annotations at run time.
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from memq.contracts.queries import FACT_ID_PATTERN, FactHistoryView, FactsGet, FactsView, ProfileView
from memq.contracts.vocabulary import SearchMode
from memq.workers.http.params import query
from memq.workers.http.routes.common import BASE, Client, User, as_json

facts_router = APIRouter(tags=["facts"])

MIN_SEQ_HELP = "wait until facts are derived up to this sequence (the reply's `behind` says if they are not)"


@facts_router.get(BASE + "/facts", response_model=FactsView)
async def facts(
    client: Client,
    user: User,
    q: Annotated[str | None, query(FactsGet, "query", "only the facts that relate to it, best first")] = None,
    mode: Annotated[SearchMode, Query(description="how a query ranks: keyword, vector or hybrid")] = "hybrid",
    include_invalid: Annotated[bool, query(FactsGet, "include_invalid")] = False,
    limit: Annotated[int, query(FactsGet, "limit")] = 20,
    min_seq: Annotated[int | None, query(FactsGet, "min_seq", MIN_SEQ_HELP)] = None,
) -> Response:
    """Facts about the user, derived from their turns (current ones, oldest first; with `q`, ranked)."""
    return as_json(
        await client.facts(user, q, mode=mode, include_invalid=include_invalid, limit=limit, min_seq=min_seq)
    )


@facts_router.get(BASE + "/profile", response_model=ProfileView)
async def profile(
    client: Client,
    user: User,
    min_seq: Annotated[int | None, query(FactsGet, "min_seq", MIN_SEQ_HELP)] = None,
) -> Response:
    """The user's current facts, grouped by the entities they name."""
    return as_json(await client.profile(user, min_seq=min_seq))


@facts_router.get(BASE + "/facts/{fact_id}/history", response_model=FactHistoryView)
async def fact_history(
    client: Client,
    user: User,
    fact_id: Annotated[str, Path(pattern=FACT_ID_PATTERN, description="the fact's id, as /facts gives it")],
) -> Response:
    """Every revision of one fact about the user, oldest first."""
    return as_json(await client.fact_history(user, fact_id))
