"""The query worker's request slots, shared fairly among apps, and its reads
waiting for a ``min_seq``, which hold none.

A replica answers at most ``query.max_inflight`` requests at once. That was
once one semaphore, taken inside the subscription's callback:
an app that sent 260 reads waiting 30 s each for a sequence nobody would
write held every slot, and since nats-py runs a subscription's callbacks one
at a time, every other app's requests queued unread behind them. Now:

- a request is admitted without waiting (:meth:`RequestSlots.admit`): a
  slot now, a place in its app's queue when the pool is full, or, when its
  app already holds its share (``query.app_share`` of the slots, counting
  its queue), :class:`~memq.contracts.errors.Busy` at once; the callback
  never blocks, so another app's requests are always read
  (:mod:`memq.workers.memory.shares` says who is served next);
- a read waiting for its ``min_seq`` gives its slot back while it waits
  (:meth:`RequestSlots.waiting`), and takes one of its app's waiting places
  instead (``query.app_waiting``; past it, ``Busy``); once the commit lands,
  it queues for a slot again and is never refused then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from memq.contracts.errors import Busy
from memq.workers.memory.shares import Caps, FairShares, share_of


class Slot:
    """One request's hold on the pool, from its admission to :meth:`close`."""

    def __init__(self, slots: RequestSlots, app: str):
        self.slots = slots
        self.app = app
        self.held = False
        self._granted: asyncio.Future[None] | None = None  # while queued

    async def ready(self) -> None:
        """Once the slot is this request's (at once, unless it was queued)."""
        if not self.held and self._granted is not None:
            await self._granted

    def close(self) -> None:
        """The request is done, or gone: its slot freed, or its place in the queue."""
        if self.held:
            self.slots._release(self)
        elif self._granted is not None:
            self.slots.shares.withdraw(self.app, self)
        self._granted = None

    def _queue(self) -> None:
        self._granted = asyncio.get_running_loop().create_future()

    def _grant(self) -> None:
        self.held = True
        if self._granted is not None and not self._granted.done():
            self._granted.set_result(None)


class RequestSlots:
    """``total`` request slots of a replica; one app holds at most ``share``
    of them (a fraction), and has at most ``waiting`` reads waiting for a
    ``min_seq`` at once."""

    def __init__(self, total: int, share: float, waiting: int):
        self.fraction = share
        self.shares: FairShares[Slot] = FairShares(total, share_of(total, share))
        self.waits = Caps(waiting)

    def admit(self, app: str, op: str) -> Slot:
        """A slot for a request of ``app`` (await :meth:`Slot.ready`), or
        Busy when ``app`` holds its share already."""
        slot = Slot(self, app)
        admission = self.shares.ask(app, slot)
        if admission == "over":
            raise Busy(
                f"{op}: app {app!r} has {self.shares.held(app)} requests in flight on this query replica, its share "
                f"(query.app_share {self.fraction:g} of query.max_inflight {self.shares.total}); retry later"
            )
        if admission == "now":
            slot.held = True
        else:
            slot._queue()
        return slot

    @asynccontextmanager
    async def waiting(self, slot: Slot, op: str) -> AsyncIterator[None]:
        """While ``slot``'s read waits for its ``min_seq``: its slot given
        back, one of its app's waiting places taken (Busy past the cap);
        after a wait that ended well, a slot again (queued when none is
        free, never refused)."""
        if not self.waits.take(slot.app):
            raise Busy(
                f"{op}: app {slot.app!r} has {self.waits.count(slot.app)} reads waiting for their min_seq on this "
                f"query replica, its cap (query.app_waiting); retry later"
            )
        self._release(slot)
        try:
            yield
        finally:
            self.waits.give(slot.app)
        # Only a read that goes on needs a slot again (a timeout's error does not).
        await self.regain(slot)

    async def regain(self, slot: Slot) -> None:
        """A slot again for a read that goes on after a wait (queued when none
        is free, never refused): after :meth:`waiting` ended well, or after a
        wait that failed when the read has another way on (a search's own
        unindexed memories)."""
        if self.shares.ask(slot.app, slot, within_share=False) == "now":
            slot.held = True
        else:
            slot._queue()
        await slot.ready()

    def _release(self, slot: Slot) -> None:
        slot.held = False
        for granted in self.shares.release(slot.app):
            granted._grant()
