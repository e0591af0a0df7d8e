"""A query replica's latest window of each session it answered, kept current
by reading only what was committed since.

An agent's turn is an append, then a read of its session that must hold it:
the commit drops the cached answer, so that read is always a miss. Rather
than walking the session's newest events again (hundreds of events decoded
for a window of a hundred), the miss reads the session row and the events
after the cached window's ``through`` (the commit floor when it was read),
and extends the window with them (:func:`memq.workers.sql.window.load_session_window`).

Only this replica's memory: the answers themselves are still cached (and
shared) by :mod:`memq.workers.query.cache`; a window is never served as it
is, only extended, so it needs no invalidation: a delete or a new summary
is seen in the session row, which every read fetches, and the window is
then read afresh.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.workers.memory.strategies import Strategy
from memq.workers.sql import reads
from memq.workers.sql.window import SessionWindow, load_session_window

# A window this long is read afresh each time rather than kept: "all" and
# very large budgets would hold whole sessions in every replica's memory.
MAX_EVENTS = 2048


class WindowCache:
    """LRU of :class:`SessionWindow` by (session, strategy, model, filter).

    :param floor: the commit floor of an app's stream as known now, without I/O.
    :param max_windows: sessions kept; 0 turns the cache off (every read
        walks the session afresh).
    """

    def __init__(self, floor: Callable[[str], int], max_windows: int):
        self.floor = floor
        self.max_windows = max_windows
        self._windows: OrderedDict[Hashable, SessionWindow] = OrderedDict()

    async def load(
        self,
        conn: AsyncConnection,
        app: str,
        session_key: str,
        strategy: Strategy,
        model: str | None,
        *,
        only: reads.EventFilter = reads.NO_FILTER,
        ids: list[str] | None = None,
    ) -> SessionWindow | None:
        """The session's row and window, as :func:`load_session_window` reads
        them (with ``ids`` looked up alongside), starting from the one this
        replica read last, if any."""
        through = self.floor(app)  # first: everything at or below it is in SQL for the reads below
        if not self.max_windows:
            return await load_session_window(conn, session_key, strategy, model, only=only, through=through)
        key = (session_key, strategy, model, only)
        found = await load_session_window(
            conn, session_key, strategy, model, only=only, through=through, last=self._windows.get(key), ids=ids
        )
        if found is None or len(found.window.items) > MAX_EVENTS:
            self._windows.pop(key, None)
            return found
        # Concurrent reads of one session each store theirs: any is correct
        # up to its own ``through``, so the last one stored is as good.
        self._windows[key] = replace(found, stored_ids=None) if found.stored_ids is not None else found
        self._windows.move_to_end(key)
        while len(self._windows) > self.max_windows:
            self._windows.popitem(last=False)
        return found
