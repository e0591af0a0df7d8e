"""The query operations: read SQL, apply working-memory policy, build replies.

Each op takes a validated request and a connection and returns a reply model.
The policy (strategies, context assembly, templates) is pure and lives in
:mod:`memq.workers.memory`; this module only decides what to read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts import queries as q
from memq.contracts.errors import InvalidRequest, NotFound, Unavailable
from memq.contracts.ids import scope_key
from memq.workers.memory.context import assemble, item_from_event
from memq.workers.memory.recall import recalled_event
from memq.workers.memory.strategies import Strategy, select, strategy_for
from memq.workers.memory.template import render
from memq.workers.memory.tokens import event_text
from memq.workers.settings import MemorySettings
from memq.workers.sql import reads
from memq.workers.sql.window import Window, load_session_window

RECALL_MARGIN = 10  # extra recall candidates, for those already in the window


def _stored(e: reads.StoredEvent) -> q.StoredEvent:
    return q.StoredEvent(seq=e.seq, tokens=e.tokens, event=e.data)


async def _session(conn: AsyncConnection, app: str, user: str, session: str) -> reads.SessionRow:
    row = await reads.session_row(conn, scope_key(app, user, session))
    if row is None:
        raise _missing(app, user, session)
    return row


def _missing(app: str, user: str, session: str) -> NotFound:
    # Same answer whether the session is missing or another user's.
    return NotFound(f"no session {session!r} of user {user!r} in app {app!r}")


async def _session_window(
    conn: AsyncConnection,
    req: q.HistoryGet | q.ContextGet,
    strategy: Strategy,
    model: str | None,
    *,
    only: reads.EventFilter = reads.NO_FILTER,
) -> Window:
    """The session's window, its row read in the same round trip as the
    checkpoint; NotFound as from :func:`_session`."""
    found = await load_session_window(conn, scope_key(req.app, req.user, req.session), strategy, model, only=only)
    if found is None:
        raise _missing(req.app, req.user, req.session)
    return found[1]


def _info(row: reads.SessionRow) -> dict[str, Any]:
    return dict(
        app=row.app,
        user=row.user,
        session=row.session,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_seq=row.last_seq,
    )


# --- operations -------------------------------------------------------------------


async def session_get(conn: AsyncConnection, req: q.SessionGet, ctx: OpContext) -> q.SessionView:
    row = await _session(conn, req.app, req.user, req.session)
    state = await reads.merged_state(conn, req.app, req.user, req.session)
    events = None
    truncated, total = False, None
    key = scope_key(req.app, req.user, req.session)
    only = _filter(req)
    if req.events or req.num_recent_events is not None or req.after_seq is not None or only:
        if req.num_recent_events is not None:
            newest = await reads.newest_events(
                conn, key, after_seq=req.after_seq or 0, limit=req.num_recent_events, only=only
            )
            events = [_stored(e) for e in reversed(newest)]
        else:
            # One more than the cap tells a whole read from a cut one: a cut
            # read says so rather than passing for the whole session.
            rows = await reads.events_after(conn, key, req.after_seq or 0, ctx.max_events + 1, only=only)
            if len(rows) > ctx.max_events:
                rows = rows[: ctx.max_events]
                # asked only when cut: how much the read left out
                truncated, total = True, await reads.count_events_after(conn, key, req.after_seq or 0, only=only)
            events = [_stored(e) for e in rows]
    return q.SessionView(**_info(row), state=state, events=events, truncated=truncated, events_total=total)


async def sessions_list(conn: AsyncConnection, req: q.SessionsList, ctx: OpContext) -> q.SessionsPage:
    try:
        rows, cursor = await reads.session_page(conn, req.app, req.user, req.limit, req.cursor)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return q.SessionsPage(sessions=[q.SessionInfo(**_info(r)) for r in rows], next_cursor=cursor)


async def state_get(conn: AsyncConnection, req: q.StateGet, ctx: OpContext) -> q.StateView:
    if req.session is not None:
        await _session(conn, req.app, req.user, req.session)
    return q.StateView(state=await reads.merged_state(conn, req.app, req.user, req.session))


def _filter(req: q.SessionGet | q.HistoryGet) -> reads.EventFilter:
    return reads.EventFilter(after=req.after, roles=tuple(req.roles or ()))


async def history(conn: AsyncConnection, req: q.HistoryGet, ctx: OpContext) -> q.HistoryView:
    """Filters first, then the strategy: ``after``/``roles`` pick events in
    SQL and the strategy windows what they picked (summary_buffer: of the
    events after the latest checkpoint; the summary is returned as usual).
    A role filter is exact, so it can keep a tool call without its result
    (or the reverse); the strategy's cuts keep together only the pairs that
    are both present. ``needs_summary`` describes the session and is only
    reported without filters."""
    strategy = ctx.strategy(req.app, req.strategy)
    model = req.model or ctx.memory.model
    only = _filter(req)
    window = await _session_window(conn, req, strategy, model, only=only)
    reserved = window.checkpoint.tokens if window.checkpoint else 0
    selection = select(window.items, strategy, reserved=reserved)
    return q.HistoryView(
        strategy=strategy.to_dict(),
        summary=window.checkpoint.summary if window.checkpoint else None,
        checkpoint_seq=window.checkpoint.up_to_seq if window.checkpoint else None,
        events=[_stored(window.stored[it.seq]) for it in selection.items],
        tokens=selection.tokens + reserved,
        over_budget=selection.tokens + reserved > strategy.budget,
        needs_summary=selection.needs_summary and not only,
    )


async def context(conn: AsyncConnection, req: q.ContextGet, ctx: OpContext) -> q.ContextView:
    strategy = ctx.strategy(req.app, req.strategy)
    model = req.model or ctx.memory.model
    window = await _session_window(conn, req, strategy, model)
    instruction = None
    if req.instruction:
        state = await reads.merged_state(conn, req.app, req.user, req.session)
        instruction = render(req.instruction, state)
    if req.message is not None:
        window = _with_pending(window, req.message, model)
    recalled = await _recall(ctx, req, window)
    built = assemble(
        history=window.items,
        events=window.events,
        strategy=strategy,
        summary=window.checkpoint.summary if window.checkpoint else None,
        recalled=recalled,
        recall_limit=req.recall_limit,
        instruction=instruction,
        model=model,
    )
    return q.ContextView(
        format=req.format,
        tokens=built.tokens.to_dict(),
        messages=built.to_openai(),
        context=built.to_memq() if req.format == "memq" else None,
        # in every format, not only memq's: an OpenAI-format caller must learn it too
        budget=strategy.budget,
        over_budget=built.over_budget,
        note=built.note,
    )


PENDING_SEQ = 0  # the pending message's place holder: real seqs start at 1


def _with_pending(window: Window, text: str, model: str | None) -> Window:
    """The window with a not-yet-stored user message last (seq 0)."""
    event = {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": text}]}}
    return Window(
        items=[*window.items, item_from_event(PENDING_SEQ, event, model=model)],
        events={**window.events, PENDING_SEQ: event},
        stored=window.stored,
        checkpoint=window.checkpoint,
    )


async def _recall(ctx: OpContext, req: q.ContextGet, window: Window) -> list[tuple[int, dict[str, Any], int]]:
    """Memories for the context, found with the last user message; extra
    candidates cover those the window already holds (assemble skips them)."""
    if ctx.searcher is None or req.recall_limit == 0:
        return []
    last_user = next((it for it in reversed(window.items) if it.role == "user"), None)
    if last_user is None:
        return []
    text = event_text(window.events[last_user.seq])
    hits = await ctx.searcher.recall(req.app, req.user, text, k=req.recall_limit + RECALL_MARGIN)
    return [(h.doc.seq, recalled_event(h.doc), 0) for h in hits]


async def search(conn: AsyncConnection | None, req: q.Search, ctx: OpContext) -> q.SearchResults:
    if ctx.searcher is None:
        raise Unavailable("search is not enabled on this query worker")
    return await ctx.searcher.search(req)


async def artifacts_list(conn: AsyncConnection, req: q.ArtifactsList, ctx: OpContext) -> q.ArtifactsView:
    await _session(conn, req.app, req.user, req.session)
    listing = await reads.artifact_list(conn, scope_key(req.app, req.user, req.session))
    return q.ArtifactsView(artifacts=[q.ArtifactInfo(**a) for a in listing])


async def artifact_get(conn: AsyncConnection, req: q.ArtifactGet, ctx: OpContext) -> q.ArtifactView:
    await _session(conn, req.app, req.user, req.session)
    row, version = await reads.artifact_version(
        conn, scope_key(req.app, req.user, req.session), req.filename, req.version
    )
    if row is None:
        which = "latest version" if req.version is None else f"version {req.version}"
        raise NotFound(f"no {which} of artifact {req.filename!r}")
    obj = None
    if row.object_name is not None:
        obj = {"bucket": row.object_bucket, "name": row.object_name, "size": row.size, "sha256": row.sha256}
    return q.ArtifactView(
        filename=row.filename,
        version=version,
        seq=row.seq,
        mime_type=row.mime_type,
        size=row.size,
        sha256=row.sha256,
        inline=row.inline,
        object=obj,
    )


@dataclass(frozen=True)
class OpContext:
    memory: MemorySettings
    apps: Mapping[str, Mapping[str, Any]]
    max_events: int = q.MAX_EVENTS  # a whole-session read returns at most this many (and says so)
    searcher: Any = None  # memq.workers.query.search.Searcher: search and recall

    def strategy(self, app: str, spec: q.StrategySpec | None) -> Strategy:
        return strategy_for(self.memory, self.apps.get(app, {}), spec)


@dataclass(frozen=True)
class Handler:
    """How the query worker answers one op of :data:`memq.contracts.queries.OPS`:
    facts the contract leaves to the worker."""

    # (connection, request, context): each handler takes its own request type
    run: Callable[..., Awaitable[q._Reply]]
    # The answer depends on one session (or one user's state) and is cached;
    # a page of sessions changes with every commit in the app and is not.
    cached: bool
    sql: bool = True  # runs on a database connection (else it gets None)


# Keyed by the contract's op names; tests/unit/test_query_registry.py checks
# that every op of the contract has a handler and no handler lacks an op.
HANDLERS: dict[str, Handler] = {
    "session.get": Handler(session_get, cached=True),
    "sessions.list": Handler(sessions_list, cached=False),
    "state.get": Handler(state_get, cached=True),
    "history": Handler(history, cached=True),
    "context": Handler(context, cached=True),
    "artifacts.list": Handler(artifacts_list, cached=True),
    "artifacts.get": Handler(artifact_get, cached=True),
    "search": Handler(search, cached=False, sql=False),
}
