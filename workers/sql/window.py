"""The window a strategy needs, read backwards from a session's newest event.

Shared by the query worker (history, context) and the summarizer (what to
fold): both read a session the same way, so the walk lives with the other SQL
reads rather than in either worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.workers.memory.context import item_from_event
from memq.workers.memory.strategies import Item, Strategy
from memq.workers.sql import reads

PAGE = 256  # events read per round trip when walking a session backwards


@dataclass(frozen=True)
class Window:
    """Events a strategy may need, oldest first, plus the checkpoint they follow."""

    items: list[Item]
    events: dict[int, dict[str, Any]]
    stored: dict[int, reads.StoredEvent]
    checkpoint: reads.CheckpointRow | None


def _enough(strategy: Strategy, items: list[Item], reserved: int) -> bool:
    """Has the backward walk read everything this strategy can keep? One page
    of margin covers a tool call whose result opens the window."""
    if strategy.kind == "all":
        return False
    if strategy.kind == "buffer_window":
        if strategy.turns is not None:
            return sum(1 for it in items if it.role == "user") > strategy.turns + 1
        return len(items) > strategy.window + PAGE // 2
    return sum(it.tokens for it in items) + reserved > strategy.budget + 2048


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
    checkpoint = await reads.latest_checkpoint(conn, session_key) if strategy.kind == "summary_buffer" else None
    return await _walk(conn, session_key, strategy, model, reserved, only, checkpoint)


async def load_session_window(
    conn: AsyncConnection,
    session_key: str,
    strategy: Strategy,
    model: str | None,
    reserved: int = 0,
    *,
    only: reads.EventFilter = reads.NO_FILTER,
) -> tuple[reads.SessionRow, Window] | None:
    """The visible session's row and its window (as :func:`load_window`), or
    None when there is no such session: the row and the latest checkpoint
    come in one statement, so a short session costs two round trips."""
    if strategy.kind == "summary_buffer":
        row, checkpoint = await reads.session_and_checkpoint(conn, session_key)
    else:
        row, checkpoint = await reads.session_row(conn, session_key), None
    if row is None:
        return None
    return row, await _walk(conn, session_key, strategy, model, reserved, only, checkpoint)


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
        items_newest_first += [_item(e, model) for e in page]
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
