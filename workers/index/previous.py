"""The previous turn of a session, for the context of the next doc.

Read from SQL, the source of truth, once the persistence worker's ack floor
has passed the batch: then every earlier event is there, so a doc's context
is the same whichever replica indexes it, in whatever batch, and in a
rebuild. (Tracking turns in the indexer's memory would depend on which
replica saw what.) The query worker reads them the same way for a search's
memories the index has not reached yet (:mod:`memq.workers.query.stream_unindexed`),
so those are the docs the indexer will write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from sqlalchemy import select

from memq.contracts.errors import NotCommitted
from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, EventAppended, EventForgotten
from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.memory.recall import StorageScope, Turn, doc_for, turn_of
from memq.workers.sql.reads import EVENTS


class Floor(Protocol):
    """The persistence commit floor (:class:`memq.workers.runtime.commit_floor.CommitFloor`,
    which this shared folder may not import: the runtime imports the index)."""

    async def wait_for(self, seq: int, timeout_s: float) -> int: ...


LOOKBACK = 5  # events looked at for one with text (tool calls may come between)


class PreviousTurns:
    """The turn before an event, from SQL. ``floor_of(app)``: the commit
    floor of the stream that holds ``app``'s messages (sequences are per
    stream)."""

    def __init__(self, engine, floor_of: Callable[[str], Floor], scope: StorageScope, wait_s: float = 30.0):
        self.engine, self.floor_of, self.scope, self.wait_s = engine, floor_of, scope, wait_s

    async def before(self, firsts: Mapping[str, tuple[int, EventAppended | EventForgotten]]) -> dict[str, Turn]:
        """For each session key, the turn before ``seq`` (absent: none); the
        message names the session (an event of it, or any message of it).
        Raises IndexUnavailable while persistence lags (retry later)."""
        if not firsts:
            return {}
        highest: dict[Floor, int] = {}  # each stream's floor, waited on once for its highest seq
        for seq, message in firsts.values():
            floor = self.floor_of(message.app)
            highest[floor] = max(seq, highest.get(floor, 0))
        try:
            for floor, seq in highest.items():
                await floor.wait_for(seq, self.wait_s)
        except NotCommitted as exc:
            raise IndexUnavailable(f"waiting for the persistence worker: {exc.message}") from None
        found: dict[str, Turn] = {}
        async with self.engine.connect() as conn:
            for key, (seq, message) in firsts.items():
                rows = await conn.execute(
                    select(EVENTS.c.seq, EVENTS.c.data)
                    .where(EVENTS.c.session_key == key, EVENTS.c.seq < seq)
                    .order_by(EVENTS.c.seq.desc())
                    .limit(LOOKBACK)
                )
                for row in rows:
                    earlier = EventAppended(
                        app=message.app,
                        user=message.user,
                        session=message.session,
                        event=Event.model_validate_json(row.data),
                    )
                    if (doc := doc_for(row.seq, earlier, self.scope)) is not None:
                        found[key] = turn_of(doc)
                        break
        return found

    async def next_turn(self, forget: EventForgotten, seq: int) -> tuple[int, EventAppended] | None:
        """The event whose doc took the forgotten event's turn as its context:
        the first after it, below the forget at ``seq``, that makes a doc
        under this scope; None if there is none in SQL. Call after
        :meth:`before` has waited for ``seq``: every event below it is in
        SQL, and the forgotten one is not any more."""
        key = scope_key(forget.app, forget.user, forget.session)
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(EVENTS.c.seq, EVENTS.c.data)
                .where(EVENTS.c.session_key == key, EVENTS.c.seq > forget.seq, EVENTS.c.seq < seq)
                .order_by(EVENTS.c.seq)
                .limit(LOOKBACK)
            )
            for row in rows:
                later = EventAppended(
                    app=forget.app, user=forget.user, session=forget.session, event=Event.model_validate_json(row.data)
                )
                if doc_for(row.seq, later, self.scope) is not None:
                    return row.seq, later
        return None
