"""The window a strategy needs, read backwards from a session's newest event.

Shared by the query worker (history, context) and the summarizer (what to
fold): both read a session the same way, so the walk lives with the other SQL
reads rather than in either worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.workers.memory.context import item_from_event
from memq.workers.memory.strategies import Item, Strategy
from memq.workers.offload import off_loop
from memq.workers.sql import reads

PAGE = 256  # events read per round trip when walking a session backwards


@dataclass(frozen=True)
class Window:
    """Events a strategy may need, oldest first, plus the checkpoint they follow."""

    items: list[Item]
    events: dict[int, dict[str, Any]]
    stored: dict[int, reads.StoredEvent]
    checkpoint: reads.CheckpointRow | None
    # What readers derived from one event (the query worker: its rendering
    # in a reply), by (seq, …): kept with the window while the window is
    # kept (see memq.workers.query.windows), so a stored event is rendered once.
    memo: dict[tuple, Any] = field(default_factory=dict)


def _enough(strategy: Strategy, items: list[Item], reserved: int) -> bool:
    """Has the backward walk read everything this strategy can keep?"""
    return strategy.needs_from(items, reserved) is not None


async def load_window(
    conn: AsyncConnection,
    session_key: str,
    strategy: Strategy,
    model: str | None,
    reserved: int = 0,
    *,
    only: reads.EventFilter = reads.NO_FILTER,
) -> Window:
    """Walk the session backwards from its newest event (index range scans on
    (session_key, seq)), stopping at the latest checkpoint for summary_buffer
    and as soon as the strategy has all it can keep: a 10,000-event session
    costs what its window costs, not what its history costs.

    :param only: read only the events that pass this filter (in SQL); the
        strategy then sees those alone. Default: every event.
    """
    checkpoint = await reads.latest_checkpoint(conn, session_key) if strategy.from_checkpoint else None
    return await _walk(conn, session_key, strategy, model, reserved, only, checkpoint)


@dataclass(frozen=True)
class SessionWindow:
    """A visible session's row and its window. The window holds every stored
    event of the session from its first one up to ``through`` (and maybe
    some newer: with several persistence replicas, commits land out of
    order, so only what is at or below the commit floor is known complete)."""

    row: reads.SessionRow
    window: Window
    through: int
    # The seq of each id asked for (``ids``) that the session holds, read
    # in the same statement; None when that statement did not run.
    stored_ids: dict[str, int] | None = None


async def load_session_window(
    conn: AsyncConnection,
    session_key: str,
    strategy: Strategy,
    model: str | None,
    reserved: int = 0,
    *,
    only: reads.EventFilter = reads.NO_FILTER,
    through: int = 0,
    last: SessionWindow | None = None,
    ids: list[str] | None = None,
) -> SessionWindow | None:
    """The visible session's row and its window (as :func:`load_window`), or
    None when there is no such session: the row and the latest checkpoint
    come in one statement, so a short session costs two round trips.

    :param through: the commit floor, read before this call: every event at
        or below it is committed (and so is visible to these reads).
    :param last: an earlier answer of this call for the same session,
        strategy, model and filter. While the session was neither deleted
        nor summarized since, only the events after its ``through`` are read
        (newer ones it held may have had gaps) and the window is extended
        with them: the read after an agent's append costs what was appended,
        not the whole window again.
    :param ids: event ids to look up in the same round trip, where the read
        is one statement (see ``stored_ids``).
    """
    newer: list[reads.StoredEvent] | None = None
    stored_ids = None
    if last is not None and not only:  # the likely case, the read after an append: one round trip
        row, checkpoint, newer, stored_ids = await reads.session_checkpoint_and_newer(
            conn, session_key, after_seq=last.through, limit=PAGE, ids=ids
        )
    elif strategy.from_checkpoint:
        row, checkpoint = await reads.session_and_checkpoint(conn, session_key)
    else:
        row, checkpoint = await reads.session_row(conn, session_key), None
    if not strategy.from_checkpoint:
        checkpoint = None
    if row is None:
        return None
    if last is not None and _same_history(last, row, checkpoint):
        if newer is None:
            newer = await reads.newest_events(conn, session_key, after_seq=last.through, limit=PAGE, only=only)
        if len(newer) < PAGE:  # all of them: else reading afresh costs no more
            counted = await _items(newer[::-1], model)
            window = _extended(last.window, newer, counted, last.through, strategy, reserved)
            return SessionWindow(row, window, max(through, last.through), stored_ids if ids else None)
    return SessionWindow(row, await _walk(conn, session_key, strategy, model, reserved, only, checkpoint), through)


def _same_history(last: SessionWindow, row: reads.SessionRow, checkpoint: reads.CheckpointRow | None) -> bool:
    """Nothing but appends since ``last``: no delete (the tombstone would have
    moved), no forgotten event (nor would ``forgot_seq``) and no new summary
    (the window starts after the checkpoint)."""
    before = last.window.checkpoint
    if (row.deleted_seq, row.forgot_seq) != (last.row.deleted_seq, last.row.forgot_seq):
        return False
    return ((before.seq, before.up_to_seq) if before else None) == (
        (checkpoint.seq, checkpoint.up_to_seq) if checkpoint else None
    )


def _extended(
    window: Window,
    newer: list[reads.StoredEvent],
    counted: list[Item],
    through: int,
    strategy: Strategy,
    reserved: int,
) -> Window:
    """``window``'s events up to ``through``, then ``newer`` (every stored
    event after ``through``, newest first; ``counted``: their items, oldest
    first), less the oldest events that the
    strategy no longer needs (the shortest suffix that is enough, as the walk
    stops at)."""
    # The likely case: no event above the floor (read while a replica
    # committed out of order) to leave out; the maps are in seq order.
    if next(reversed(window.stored), 0) <= through:
        return _appended(window, newer, counted, strategy, reserved)
    stored = [e for e in window.stored.values() if e.seq <= through] + newer[::-1]
    items = [it for it in window.items if it.seq <= through] + counted
    start = strategy.needs_from(items, reserved) or 0
    stored, items = stored[start:], items[start:]
    kept = {e.seq: e for e in stored}
    return Window(
        items=items,
        events={e.seq: e.data for e in stored},
        stored=kept,
        checkpoint=window.checkpoint,
        # a kept event is the same stored event: what was derived from it holds
        memo={k: v for k, v in window.memo.items() if k[0] <= through and k[0] in kept},
    )


def _appended(
    window: Window, newer: list[reads.StoredEvent], counted: list[Item], strategy: Strategy, reserved: int
) -> Window:
    """:func:`_extended` of a window whose events are all at or below its
    ``through``: copies of its dicts (C speed) with the new events added and
    the dropped ones deleted, rather than every dict built again in Python
    (the rebuild was 14 % of the query worker's CPU at 64 agents)."""
    items = window.items + counted
    start = strategy.needs_from(items, reserved) or 0
    events, stored = dict(window.events), dict(window.stored)
    for e in reversed(newer):
        events[e.seq], stored[e.seq] = e.data, e
    for it in items[:start]:
        del events[it.seq], stored[it.seq]
    memo = dict(window.memo)
    if len(memo) > 2 * len(stored):  # what dropped events left, cleared now and then rather than at every drop
        memo = {k: v for k, v in memo.items() if k[0] in stored}
    return Window(items=items[start:], events=events, stored=stored, checkpoint=window.checkpoint, memo=memo)


def with_tail(
    window: Window,
    tail: list[reads.StoredEvent],
    strategy: Strategy,
    model: str | None,
    *,
    tombstone: int,
    reserved: int = 0,
) -> Window:
    """``window`` as it reads once the events of an uncommitted tail (see
    :mod:`memq.workers.memory.tail`) are committed: those at or above the
    session's ``tombstone``, after the window's checkpoint and not already
    in it (a replica may have committed some), in seq order, less the oldest
    events the strategy no longer needs (as the walk stops at)."""
    after = window.checkpoint.up_to_seq if window.checkpoint else 0
    new = [e for e in tail if e.seq >= tombstone and e.seq > after and e.seq not in window.stored]
    if not new:
        return window
    by_seq = {e.seq: e for e in window.stored.values()} | {e.seq: e for e in new}
    items = sorted([*window.items, *(_item(e, model) for e in new)], key=lambda it: it.seq)
    start = strategy.needs_from(items, reserved) or 0
    items = items[start:]
    stored = {it.seq: by_seq[it.seq] for it in items}
    return Window(
        items=items,
        events={seq: e.data for seq, e in stored.items()},
        stored=stored,
        checkpoint=window.checkpoint,
        memo=dict(window.memo),  # the kept window's own memo stays as SQL holds it
    )


async def _walk(
    conn: AsyncConnection,
    session_key: str,
    strategy: Strategy,
    model: str | None,
    reserved: int,
    only: reads.EventFilter,
    checkpoint: reads.CheckpointRow | None,
) -> Window:
    after = checkpoint.up_to_seq if checkpoint else 0
    newest_first: list[reads.StoredEvent] = []
    items_newest_first: list[Item] = []
    before: int | None = None
    while True:
        page = await reads.newest_events(conn, session_key, after_seq=after, before_seq=before, limit=PAGE, only=only)
        newest_first += page
        items_newest_first += await _items(page, model)
        if len(page) < PAGE or _enough(strategy, items_newest_first, reserved):
            break
        before = page[-1].seq
    stored = list(reversed(newest_first))
    return Window(
        items=list(reversed(items_newest_first)),
        events={e.seq: e.data for e in stored},
        stored={e.seq: e for e in stored},
        checkpoint=checkpoint,
    )


def _item(e: reads.StoredEvent, model: str | None) -> Item:
    # Stored counts are for cl100k_base; another model is counted here.
    return item_from_event(e.seq, e.data, model=model, tokens=e.tokens if model is None and e.tokens else None)


# Text characters per stored token, roughly (cl100k_base, English): to tell
# a long page from a short one without walking its events.
CHARS_PER_TOKEN = 4
UNCOUNTED = 1_000  # tokens assumed for an event stored without a count


async def _items(events: list[reads.StoredEvent], model: str | None) -> list[Item]:
    """:func:`_item` of each event, in a thread when they must be counted
    (another model than the stored counts', or no stored count) and are long:
    a caller naming a model makes a whole window be counted again."""
    recount = sum(e.tokens or UNCOUNTED for e in events if model is not None or not e.tokens)
    return await off_loop(recount * CHARS_PER_TOKEN, _counted, events, model)


def _counted(events: list[reads.StoredEvent], model: str | None) -> list[Item]:
    return [_item(e, model) for e in events]
