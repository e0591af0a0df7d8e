"""Working memory: a session's history as a strategy keeps it, and its context
(what to send to the model), by GET parameters or a JSON body."""

# No `from __future__ import annotations`: FastAPI reads the annotations at run time.
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from memq.contracts.client import MemoryClient, event_filters
from memq.contracts.queries import ContextFormat, ContextGet, ContextView, HistoryView, StrategyName, StrategySpec
from memq.workers.http.params import field, query
from memq.workers.http.routes.common import (
    SESSION_PATH,
    After,
    Budget,
    Client,
    Cursor,
    MinSeq,
    Model,
    Roles,
    Session,
    StrategyKind,
    Turns,
    User,
    Window,
    as_json,
    strategy_spec,
)

memory = APIRouter(tags=["memory"])


class ContextBody(BaseModel):
    """A context request in a body (long instructions and messages do not fit a
    URL): the contract's fields, the strategy flat as in the GET's parameters."""

    strategy: StrategyName | None = None
    budget: int | None = field(StrategySpec, "budget")
    window: int | None = field(StrategySpec, "window")
    turns: int | None = field(StrategySpec, "turns")
    model: str | None = field(ContextGet, "model")
    format: ContextFormat = field(ContextGet, "format")
    instruction: str | None = field(ContextGet, "instruction")
    recall_limit: int = field(ContextGet, "recall_limit")
    facts_limit: int = field(ContextGet, "facts_limit")
    message: str | None = field(ContextGet, "message")
    cursor: str | None = field(ContextGet, "cursor")
    min_seq: int | None = field(ContextGet, "min_seq")


@memory.get(SESSION_PATH + "/history", response_model=HistoryView)
async def history(
    client: Client,
    user: User,
    session: Session,
    strategy: StrategyKind = None,
    budget: Budget = None,
    window: Window = None,
    turns: Turns = None,
    model: Model = None,
    after: After = None,
    roles: Roles = [],  # noqa: B006 - FastAPI copies a parameter's default per request
    cursor: Cursor = None,
    min_seq: MinSeq = None,
) -> Response:
    """A session's events as a working-memory strategy keeps them, with token counts (one page)."""
    view = await client.page(
        "history",
        min_seq=min_seq,
        user=user,
        session=session,
        strategy=strategy_spec(strategy, budget, window, turns),
        model=model,
        cursor=cursor,
        **event_filters(after, roles),
    )
    return as_json(view)


async def _context(client: MemoryClient, user: str, session: str, q: ContextBody) -> Response:
    view: ContextView = await client.page(
        "context",
        min_seq=q.min_seq,
        user=user,
        session=session,
        strategy=strategy_spec(q.strategy, q.budget, q.window, q.turns),
        model=q.model,
        format=q.format,
        instruction=q.instruction,
        recall_limit=q.recall_limit,
        facts_limit=q.facts_limit,
        message=q.message,
        cursor=q.cursor,
    )
    return as_json(view)


@memory.get(SESSION_PATH + "/context", response_model=ContextView)
async def context(
    client: Client,
    user: User,
    session: Session,
    strategy: StrategyKind = None,
    budget: Budget = None,
    window: Window = None,
    turns: Turns = None,
    model: Model = None,
    format: Annotated[ContextFormat, Query(description="`memq` or `openai` (chat messages)")] = "memq",
    instruction: Annotated[
        str | None, query(ContextGet, "instruction", "system instruction template, from state")
    ] = None,
    recall_limit: Annotated[int, query(ContextGet, "recall_limit", "long-term memories to recall")] = 20,
    facts_limit: Annotated[int, query(ContextGet, "facts_limit", "facts about the user to include")] = 0,
    message: Annotated[str | None, query(ContextGet, "message", "a user message not stored yet")] = None,
    cursor: Cursor = None,
    min_seq: MinSeq = None,
) -> Response:
    """What to send to the model: recalled memories, summary and recent window within the budget (one page)."""
    q = ContextBody(
        strategy=strategy,
        budget=budget,
        window=window,
        turns=turns,
        model=model,
        format=format,
        instruction=instruction,
        recall_limit=recall_limit,
        facts_limit=facts_limit,
        message=message,
        cursor=cursor,
        min_seq=min_seq,
    )
    return await _context(client, user, session, q)


@memory.post(SESSION_PATH + "/context", response_model=ContextView)
async def context_from_body(client: Client, user: User, session: Session, body: ContextBody) -> Response:
    """The same as GET, its parameters in a JSON body (for long instructions and messages)."""
    return await _context(client, user, session, body)
