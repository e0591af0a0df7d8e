"""The query operations: read SQL, apply working-memory policy, build replies.

Each op takes a validated request and a connection and returns a reply model.
The policy (strategies, context assembly, templates) is pure and lives in
:mod:`memq.workers.memory`; this module only decides what to read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts import queries as q
from memq.contracts.errors import InvalidRequest, NotFound, Oversize, Unavailable
from memq.contracts.ids import scope_key
from memq.workers.memory.context import assemble, item_from_event
from memq.workers.memory.recall import recalled_event
from memq.workers.memory.strategies import Strategy, select, strategy_for
from memq.workers.memory.tail import MustWait
from memq.workers.memory.template import render, rendered_size
from memq.workers.memory.tokens import event_messages, event_text
from memq.workers.offload import off_loop
from memq.workers.query import facts, paging
from memq.workers.query.stream_tail import Tail
from memq.workers.query.windows import WindowCache
from memq.workers.settings import MemorySettings
from memq.workers.sql import reads
from memq.workers.sql.window import Window, with_tail

RECALL_MARGIN = 10  # extra recall candidates, for those already in the window


def _stored(e: reads.StoredEvent) -> q.StoredEvent:
    # Unvalidated: the row's own types (int, int, the dict its JSON decoded
    # to) are what the model would hold, and validating copied every event
    # dict of every page; the reply's JSON is the same.
    return q.StoredEvent.model_construct(seq=e.seq, tokens=e.tokens, event=e.data)


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
    ctx: OpContext,
    *,
    only: reads.EventFilter = reads.NO_FILTER,
    tail: Tail | None = None,
) -> Window:
    """The session's window, its row read in the same round trip as the
    checkpoint (extended from this replica's last read of it, if any: see
    :mod:`memq.workers.query.windows`); NotFound as from :func:`_session`.
    With a ``tail``, also the session's uncommitted appends (see
    :mod:`memq.workers.query.stream_tail`); MustWait when they need the commit."""
    key = scope_key(req.app, req.user, req.session)
    rows = await tail.appended() if tail is not None else []
    ids = [r["event_id"] for r in rows] or None
    found = await ctx.windows.load(conn, req.app, key, strategy, model, only=only, ids=ids)
    if found is None:
        if tail is None:
            raise _missing(req.app, req.user, req.session)
        if not rows:  # its first append may be in the tail, or it may not exist
            raise MustWait("the session is not in SQL yet")
        # A session SQL does not show (never held, or deleted at or below
        # the floor) begins in the tail: an agent's first turn of a
        # conversation, while another app's backlog holds its commit back.
        # Everything up to the floor is in SQL, so nothing of it comes
        # before the tail.
        events = await tail.events(conn, rows, 0, {})
        return with_tail(Window(items=[], events={}, stored={}, checkpoint=None), events, strategy, model, tombstone=0)
    if tail is None:
        return found.window
    stored = found.stored_ids if ids else {}
    events = await tail.events(conn, rows, found.row.last_seq, stored)
    return with_tail(found.window, events, strategy, model, tombstone=found.row.deleted_seq)


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
    """The session, its state and, when asked, its events: every one of them,
    in pages of ``ctx.reply_bytes`` read by seq up to the newest the first
    page saw (its ``last_seq``, or the newest of ``num_recent_events``)."""
    cursor = paging.decode("session.get", req)
    row = await _session(conn, req.app, req.user, req.session)
    key = scope_key(req.app, req.user, req.session)
    only = _filter(req)
    if cursor is not None:  # a continuation: the next events, nothing else
        view = q.SessionView(**_info(row), state={}, events=[])
        return await _next_events("session.get", req, conn, key, cursor, view, ctx, only)
    view = q.SessionView(**_info(row), state=await reads.merged_state(conn, req.app, req.user, req.session))
    if not (req.events or req.num_recent_events is not None or req.after_seq is not None or only):
        return view
    view = view.model_copy(update={"events": []})
    room = ctx.reply_bytes - paging.body_size(view)
    if req.num_recent_events is not None:
        newest = await reads.newest_events(
            conn, key, after_seq=req.after_seq or 0, limit=req.num_recent_events, only=only
        )
        return _first_events("session.get", req, view, list(reversed(newest)), room)
    start = paging.Cursor(snapshot=row.last_seq, after=req.after_seq or 0)
    events, _, nxt = await paging.event_run(conn, key, start, room, _sized, only=only, first=True)
    return view.model_copy(update={"events": events, "next_cursor": _encode("session.get", req, nxt)})


# --- pages of events (see memq.workers.query.paging) ---------------------------------

Paged = TypeVar("Paged", q.SessionView, q.HistoryView)


def _sized(e: reads.StoredEvent) -> tuple[q.StoredEvent, int]:
    # Sized from the stored dict: the bytes the reply's JSON gives it.
    return _stored(e), paging.json_size({"seq": e.seq, "tokens": e.tokens, "event": e.data})


def _encode(op: str, req: q.Request, cursor: paging.Cursor | None) -> str | None:
    return None if cursor is None else paging.encode(op, req, cursor)


def _first_events(op: str, req: q.Request, view: Paged, chosen: list[reads.StoredEvent], room: int) -> Paged:
    """The first page of events already read (a window, the newest N): those
    that fit ``room``, and a cursor for the rest. ``chosen`` is always the
    newest of what the filters keep, so the rest is exactly what passes them
    in (the last sent, the newest chosen]: later pages read that range."""
    events, _, full = paging.fill(map(_sized, chosen), room, at_least_one=False)
    nxt = None
    if full:
        after = events[-1].seq if events else chosen[0].seq - 1
        nxt = paging.Cursor(snapshot=chosen[-1].seq, after=after)
    return view.model_copy(update={"events": events, "next_cursor": _encode(op, req, nxt)})


async def _next_events(
    op: str,
    req: q.Request,
    conn: AsyncConnection,
    key: str,
    cursor: paging.Cursor,
    view: Paged,
    ctx: OpContext,
    only: reads.EventFilter,
) -> Paged:
    """A continuation page: ``view`` with the next events that fit."""
    room = ctx.reply_bytes - paging.body_size(view)
    events, _, nxt = await paging.event_run(conn, key, cursor, room, _sized, only=only)
    return view.model_copy(update={"events": events, "next_cursor": _encode(op, req, nxt)})


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


async def history(conn: AsyncConnection, req: q.HistoryGet, ctx: OpContext, tail: Tail | None = None) -> q.HistoryView:
    """Filters first, then the strategy: ``after``/``roles`` pick events in
    SQL and the strategy windows what they picked (summary_buffer: of the
    events after the latest checkpoint; the summary is returned as usual).
    A role filter is exact, so it can keep a tool call without its result
    (or the reverse); the strategy's cuts keep together only the pairs that
    are both present. ``needs_summary`` describes the session and is only
    reported without filters.

    Pages: the first computes the whole answer and carries what fits; the
    kept events are always the newest the filters pass, so later pages read
    the rest by seq, up to the newest the first page kept."""
    cursor = paging.decode("history", req)
    strategy = ctx.strategy(req.app, req.strategy)
    model = req.model or ctx.memory.model
    only = _filter(req)
    if cursor is not None:  # a continuation: the next events, nothing else
        await _session(conn, req.app, req.user, req.session)
        view = q.HistoryView(strategy=strategy.to_dict(), events=[], tokens=0)
        key = scope_key(req.app, req.user, req.session)
        return await _next_events("history", req, conn, key, cursor, view, ctx, only)
    window = await _session_window(conn, req, strategy, model, ctx, only=only, tail=tail)
    reserved = window.checkpoint.tokens if window.checkpoint else 0
    selection = select(window.items, strategy, reserved=reserved)
    view = q.HistoryView(
        strategy=strategy.to_dict(),
        summary=window.checkpoint.summary if window.checkpoint else None,
        checkpoint_seq=window.checkpoint.up_to_seq if window.checkpoint else None,
        events=[],
        tokens=selection.tokens + reserved,
        over_budget=selection.tokens + reserved > strategy.budget,
        needs_summary=selection.needs_summary and not only,
    )
    chosen = [window.stored[it.seq] for it in selection.items]
    return _first_events("history", req, view, chosen, ctx.reply_bytes - paging.body_size(view))


async def context(conn: AsyncConnection, req: q.ContextGet, ctx: OpContext, tail: Tail | None = None) -> q.ContextView:
    """A model context, in pages when it does not fit one reply.

    The first page assembles the whole context (instruction, recall,
    summary, token counts, note: everything computed) and carries the window
    messages that fit. A window is always a suffix of the session's events
    (every strategy keeps the newest), with the pending ``message`` last, so
    the rest is the events in (the last sent, the newest in the window],
    rendered one by one exactly as the first page renders them, then the
    pending message: later pages read that range and render it, without
    assembling (nor recalling) again, so every page agrees with the first.
    """
    cursor = paging.decode("context", req)
    strategy = ctx.strategy(req.app, req.strategy)
    model = req.model or ctx.memory.model
    if cursor is not None:
        await _session(conn, req.app, req.user, req.session)
        return await _next_context(conn, req, cursor, strategy, model, ctx)
    window = await _session_window(conn, req, strategy, model, ctx, tail=tail)
    instruction = None
    if req.instruction:
        state = await reads.merged_state(conn, req.app, req.user, req.session)
        instruction = _instruction(req, req.instruction, state, ctx)
    if req.message is not None:
        window = await off_loop(len(req.message), _with_pending, window, req.message, model)
    recalled = await _recall(ctx, req, window)
    known = await _known(conn, ctx, req, window)
    built = await off_loop(
        len(instruction or ""),
        assemble,
        history=window.items,
        events=window.events,
        strategy=strategy,
        summary=window.checkpoint.summary if window.checkpoint else None,
        recalled=recalled,
        recall_limit=req.recall_limit,
        instruction=instruction,
        model=model,
        known=known,
        known_limit=req.facts_limit,
    )
    memq = req.format == "memq"
    head = dataclasses.replace(built, window=())  # everything but the window's events
    view = q.ContextView(
        format=req.format,
        tokens=built.tokens.to_dict(),
        messages=head.to_openai(),
        context=head.to_memq() if memq else None,
        # in every format, not only memq's: an OpenAI-format caller must learn it too
        budget=strategy.budget,
        over_budget=built.over_budget,
        note=built.note,
    )
    rendered = (_rendered(window, it.seq, built.events[it.seq], it.tokens, memq) for it in built.window)
    parts, _, full = paging.fill(rendered, ctx.reply_bytes - paging.body_size(view), at_least_one=False)
    nxt = None
    if full:
        stored = [it.seq for it in built.window if it.seq != PENDING_SEQ]
        sent = [part.seq for part in parts if part.seq != PENDING_SEQ]
        newest = stored[-1] if stored else 0
        nxt = paging.Cursor(snapshot=newest, after=sent[-1] if sent else (stored[0] - 1 if stored else 0))
    return _with_parts(view, parts, _encode("context", req, nxt))


def _instruction(req: q.ContextGet, template: str, state: Mapping[str, Any], ctx: OpContext) -> str:
    """The rendered instruction, refused before it is built when it would be
    longer than ``query.max_instruction_chars`` or than one reply carries: a
    few KB of ``{k}`` with a large ``k`` render hundreds of MB, and one app's
    render would hold every other app's reads meanwhile."""
    size = rendered_size(template, state)
    copies = 2 if req.format == "memq" else 1  # memq's format carries it in messages and in context
    room = ctx.reply_bytes // copies  # a character is at least one byte of the reply's JSON
    limit = min(ctx.max_instruction_chars, room)
    if size > limit:
        if limit == ctx.max_instruction_chars:
            why = "query.max_instruction_chars"
        else:
            why = f"what one reply of {ctx.reply_bytes:,} bytes carries in {req.format} format"
            why += ", which holds it twice" if copies == 2 else ""
        raise Oversize(
            f"context: the instruction would render to {size:,} characters, over the limit of {limit:,} ({why}); "
            "substitute less state or repeat it less"
        )
    return render(template, state)


@dataclass(frozen=True, slots=True)
class _WindowPart:
    """One window event of a context as a reply carries it."""

    seq: int
    messages: list[dict[str, Any]]  # its OpenAI messages
    entry: dict[str, Any] | None  # its entry of memq's ``context["window"]`` (memq format only)


def _window_part(seq: int, event: Mapping[str, Any], tokens: int, memq: bool) -> tuple[_WindowPart, int]:
    # As Context.to_openai and Context.to_memq render a window item.
    messages = event_messages(event)
    entry = {"seq": seq, "tokens": tokens, "event": dict(event)} if memq else None
    size = sum(paging.json_size(m) for m in messages) + (paging.json_size(entry) if entry else 0)
    return _WindowPart(seq, messages, entry), size


def _rendered(window: Window, seq: int, event: Mapping[str, Any], tokens: int, memq: bool) -> tuple[_WindowPart, int]:
    """:func:`_window_part`, once per stored event while its window is kept
    (the pending message is new in each request). Parts are only read after."""
    if seq == PENDING_SEQ:
        return _window_part(seq, event, tokens, memq)
    key = (seq, "context", memq)
    part = window.memo.get(key)
    if part is None:
        part = window.memo[key] = _window_part(seq, event, tokens, memq)
    return part


def _with_parts(view: q.ContextView, parts: list[_WindowPart], next_cursor: str | None) -> q.ContextView:
    update: dict[str, Any] = {
        "messages": [*view.messages, *(m for part in parts for m in part.messages)],
        "next_cursor": next_cursor,
    }
    if view.context is not None:
        update["context"] = {**view.context, "window": [*view.context["window"], *(p.entry for p in parts)]}
    return view.model_copy(update=update)


async def _next_context(
    conn: AsyncConnection,
    req: q.ContextGet,
    cursor: paging.Cursor,
    strategy: Strategy,
    model: str | None,
    ctx: OpContext,
) -> q.ContextView:
    """A continuation page of :func:`context`: the next window events that
    fit, then (once they are all sent) the pending message."""
    memq = req.format == "memq"
    view = q.ContextView(
        format=req.format, tokens={}, messages=[], context={"window": []} if memq else None, budget=strategy.budget
    )
    room = ctx.reply_bytes - paging.body_size(view)

    def render(e: reads.StoredEvent) -> tuple[_WindowPart, int]:
        # counted as load_window counts a window's events
        tokens = item_from_event(e.seq, e.data, model=model, tokens=e.tokens if model is None and e.tokens else None)
        return _window_part(e.seq, e.data, tokens.tokens, memq)

    key = scope_key(req.app, req.user, req.session)
    parts, used, nxt = await paging.event_run(conn, key, cursor, room, render)
    if nxt is None and req.message is not None:
        event = _pending_event(req.message)
        counted = await off_loop(len(req.message), item_from_event, PENDING_SEQ, event, model=model)
        pending = _window_part(PENDING_SEQ, event, counted.tokens, memq)
        if parts and used + pending[1] > room:  # on a page of its own
            nxt = paging.Cursor(snapshot=cursor.snapshot, after=cursor.snapshot)
        else:
            parts.append(pending[0])
    return _with_parts(view, parts, _encode("context", req, nxt))


PENDING_SEQ = 0  # the pending message's place holder: real seqs start at 1


def _pending_event(text: str) -> dict[str, Any]:
    return {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": text}]}}


def _with_pending(window: Window, text: str, model: str | None) -> Window:
    """The window with a not-yet-stored user message last (seq 0)."""
    event = _pending_event(text)
    return Window(
        items=[*window.items, item_from_event(PENDING_SEQ, event, model=model)],
        events={**window.events, PENDING_SEQ: event},
        stored=window.stored,
        checkpoint=window.checkpoint,
    )


def _last_user_text(window: Window) -> str | None:
    last_user = next((it for it in reversed(window.items) if it.role == "user"), None)
    return None if last_user is None else event_text(window.events[last_user.seq])


async def _known(conn: AsyncConnection, ctx: OpContext, req: q.ContextGet, window: Window) -> list[tuple[str, str]]:
    """Facts about the user for the context (``facts_limit``), best first:
    those that relate to the last user message, then the newest of the rest,
    so that a question about nothing known still shows what is known."""
    if req.facts_limit == 0:
        return []
    text = _last_user_text(window)
    return await facts.known(conn, req, text, req.facts_limit, ctx)


async def _recall(ctx: OpContext, req: q.ContextGet, window: Window) -> list[tuple[int, dict[str, Any], int]]:
    """Memories for the context, found with the last user message; extra
    candidates cover those the window already holds (assemble skips them)."""
    if ctx.searcher is None or req.recall_limit == 0:
        return []
    text = _last_user_text(window)
    if text is None:
        return []
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


def reads_tail(op: str, req: q.Request) -> bool:
    """Can this read add the session's uncommitted appends instead of
    waiting for their commit (:mod:`memq.workers.query.stream_tail`)? Only what
    depends on the session's events alone: the first page of a history
    without filters (they are applied in SQL), or of a context without an
    instruction (its state is read from SQL)."""
    if isinstance(req, q.HistoryGet):
        return req.cursor is None and not _filter(req)
    if isinstance(req, q.ContextGet):
        return req.cursor is None and not req.instruction
    return False


@dataclass(frozen=True)
class OpContext:
    memory: MemorySettings
    apps: Mapping[str, Mapping[str, Any]]
    # Bytes of one reply: session.get, history and context answer in pages
    # this big (the worker sets it from its connection's max_payload).
    reply_bytes: int = paging.reply_bytes(1024 * 1024)
    max_instruction_chars: int = 1_000_000  # query.max_instruction_chars
    searcher: Any = None  # memq.workers.query.search.Searcher: search and recall
    # The session windows this replica read last (off until the worker sets
    # it: a window is only as current as the commit floor it knows).
    windows: WindowCache = field(default_factory=lambda: WindowCache(lambda _app: 0, 0))

    def strategy(self, app: str, spec: q.StrategySpec | None) -> Strategy:
        return strategy_for(self.memory, self.apps.get(app, {}), spec)


@dataclass(frozen=True)
class Handler:
    """How the query worker answers one op of :data:`memq.contracts.queries.OPS`:
    facts the contract leaves to the worker."""

    # (connection, request, context): each handler takes its own request type
    run: Callable[..., Awaitable[q.Reply]]
    # The answer is cached until a commit makes it stale: one session's (or
    # one user's state); a page of sessions, until any session of its user
    # (or app) is committed or deleted (the cache's listing counters).
    cached: bool
    sql: bool = True  # runs on a database connection (else it gets None)
    # A request of a cached op that is not cached all the same (None: every one is).
    uncached: Callable[[Any], bool] | None = None

    def caches(self, req: q.Request) -> bool:
        return self.cached and (self.uncached is None or not self.uncached(req))


# Keyed by the contract's op names; tests/unit/test_query_registry.py checks
# that every op of the contract has a handler and no handler lacks an op.
HANDLERS: dict[str, Handler] = {
    "session.get": Handler(session_get, cached=True),
    "sessions.list": Handler(sessions_list, cached=True),
    "state.get": Handler(state_get, cached=True),
    "history": Handler(history, cached=True),
    # A context with facts is not: they change after the session's commit, which the cache keys on.
    "context": Handler(context, cached=True, uncached=lambda req: req.facts_limit > 0),
    "artifacts.list": Handler(artifacts_list, cached=True),
    "artifacts.get": Handler(artifact_get, cached=True),
    "search": Handler(search, cached=False, sql=False),
    # Facts change with no commit notice (the fact worker writes them): never cached.
    "facts": Handler(facts.facts_get, cached=False),
    "facts.profile": Handler(facts.facts_profile, cached=False),
    "facts.history": Handler(facts.fact_history, cached=False),
}
