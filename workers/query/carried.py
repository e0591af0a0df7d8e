"""Read-your-writes without waiting for the commit, from what the caller
carries: its own writes to the session that may not be committed yet
(:mod:`memq.contracts.carry`), added to what SQL holds at the commit floor.

The same reads as :mod:`memq.workers.query.stream_tail` (a history or context's
first page), through the same interface, so the ops need not know which
tail they extend. The stream tail holds every writer's messages; this one
only the caller's, so it serves reads that promise the caller's own writes
(``consistency="own"``), and costs no stream consumer. What the writes must
be for the answer to be exact, and when the read waits for the commit
after all, is pure logic (:func:`memq.workers.memory.tail.carried_events`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts import queries as q
from memq.contracts.ids import scope_key
from memq.workers.memory.tail import carried_events
from memq.workers.query.stream_tail import not_stored_elsewhere
from memq.workers.sql import reads


class CarriedTail:
    """One read's carried writes above the commit ``floor``."""

    def __init__(self, req: q.HistoryGet | q.ContextGet, carried: q.Carried, floor: int, upto: int):
        self.req = req
        self.carried = carried
        self.session_key = scope_key(req.app, req.user, req.session)
        self.after = floor
        self.upto = upto

    async def appended(self) -> list[dict[str, Any]]:
        req = self.req
        return carried_events(self.carried, self.after, self.upto, req.app, req.user, req.session, self.session_key)

    async def events(
        self, conn: AsyncConnection, rows: list[dict[str, Any]], last_seq: int, stored: dict[str, int] | None
    ) -> list[reads.StoredEvent]:
        # Nothing to check against the stream: the caller vouches for its writes.
        return await not_stored_elsewhere(conn, self.session_key, rows, stored)

    def close(self) -> None:
        pass
