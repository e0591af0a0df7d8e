"""Fair shares of one pool among apps: the query worker's request slots.

The slots of a replica (``query.max_inflight``) are shared by every app it
serves. One app must never hold them all (once, 260 reads that waited
30 s each for a sequence nobody would write took every slot, and every other
app's reads queued behind them), so:

- an app holds at most ``share`` slots, counting what it has queued: past
  that, :meth:`FairShares.ask` answers ``"over"`` and the request is refused
  at once, costing nobody else anything;
- when the pool is full (several apps at once, each within its share), a
  request queues, and freed slots go to the apps in turn (round-robin), each
  app's own requests in the order they came: an app with many queued waits
  for its own, not the others for it.

:class:`Caps` is the plain per-app count of something without a queue (the
reads waiting for their ``min_seq``, which hold no slot).

Pure bookkeeping: the caller keeps its tickets' futures and wakes the ones
:meth:`FairShares.release` hands back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, Literal, TypeVar

T = TypeVar("T", bound=Hashable)

Admission = Literal["now", "queued", "over"]


def share_of(total: int, fraction: float) -> int:
    """The slots one app may hold: ``fraction`` of ``total``, at least one."""
    return max(1, int(total * fraction))


class FairShares(Generic[T]):
    """``total`` slots, at most ``share`` held by one app; what cannot have
    one yet waits in its app's queue, and the apps take turns."""

    def __init__(self, total: int, share: int):
        if total < 1 or share < 1:
            raise ValueError(f"a pool needs a slot and a share of one at least (total {total}, share {share})")
        self.total = total
        self.share = min(share, total)
        self.used = 0
        self._in_use: dict[str, int] = {}
        self._queued: dict[str, deque[T]] = {}
        self._turns: deque[str] = deque()  # the apps with a queue, next first

    def in_use(self, app: str) -> int:
        return self._in_use.get(app, 0)

    def held(self, app: str) -> int:
        """The slots ``app`` uses and the requests it has queued: what its share bounds."""
        return self.in_use(app) + len(self._queued.get(app, ()))

    def ask(self, app: str, ticket: T, *, within_share: bool = True) -> Admission:
        """A slot for ``ticket``: ``"now"`` (it holds one), ``"queued"`` (it
        will, when :meth:`release` hands it back), or ``"over"``: ``app``
        already holds its share, and nothing was taken. ``within_share=False``
        queues it even then (a request that already had its slot and gave it
        back while it waited)."""
        if within_share and self.held(app) >= self.share:
            return "over"
        if self.used < self.total and self.in_use(app) < self.share and not self._queued.get(app):
            self._take(app)
            return "now"
        queue = self._queued.setdefault(app, deque())
        if not queue:
            self._turns.append(app)
        queue.append(ticket)
        return "queued"

    def release(self, app: str) -> list[T]:
        """``app`` gives a slot back: the queued tickets that hold one now."""
        if self.in_use(app) < 1:
            raise ValueError(f"app {app!r} holds no slot to give back")
        self._in_use[app] -= 1
        if not self._in_use[app]:
            del self._in_use[app]
        self.used -= 1
        return self._grant()

    def withdraw(self, app: str, ticket: T) -> bool:
        """Take a queued ticket out of its queue (its request is gone); False if it was not queued."""
        queue = self._queued.get(app)
        if queue is None or ticket not in queue:
            return False
        queue.remove(ticket)
        if not queue:
            del self._queued[app]
            self._turns.remove(app)
        return True

    def _take(self, app: str) -> None:
        self._in_use[app] = self.in_use(app) + 1
        self.used += 1

    def _grant(self) -> list[T]:
        granted: list[T] = []
        # Each app in turn, once per pass; an app at its share keeps its place.
        skipped = 0
        while self.used < self.total and self._turns and skipped < len(self._turns):
            app = self._turns[0]
            self._turns.rotate(-1)
            if self.in_use(app) >= self.share:
                skipped += 1
                continue
            skipped = 0
            queue = self._queued[app]
            granted.append(queue.popleft())
            self._take(app)
            if not queue:
                del self._queued[app]
                self._turns.remove(app)
        return granted


class Caps:
    """At most ``cap`` of something per app at once (no queue: past it, refuse)."""

    def __init__(self, cap: int):
        if cap < 1:
            raise ValueError(f"a cap of {cap}")
        self.cap = cap
        self._counts: dict[str, int] = {}

    def count(self, app: str) -> int:
        return self._counts.get(app, 0)

    def take(self, app: str) -> bool:
        """One more for ``app``; False (and nothing taken) when it has ``cap`` already."""
        if self.count(app) >= self.cap:
            return False
        self._counts[app] = self.count(app) + 1
        return True

    def give(self, app: str) -> None:
        if self.count(app) < 1:
            raise ValueError(f"app {app!r} holds none to give back")
        self._counts[app] -= 1
        if not self._counts[app]:
            del self._counts[app]
