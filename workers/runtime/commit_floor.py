"""Read-your-writes: is stream sequence N committed to SQL yet?

The floor is the highest N such that every sequence up to N is done. It is
learnt two ways, and the larger answer wins:

- **Notices, as they happen.** After each batch, once its acks are out, a
  persistence replica publishes the sequences it finished with (committed, or
  dead-lettered: both are acked) as runs (:class:`memq.contracts.notices.CommittedRanges`).
  :class:`ContiguousFloor` joins the runs of every replica, in whatever order
  they come, and moves the floor only over an unbroken run from it: with
  replicas committing out of order, a sequence above a missing one never
  counts, so the floor never passes an uncommitted message. A waiter is woken
  the moment the floor passes its sequence: no sleep loop, and no wait for the
  server to process the async acks (the ack floor trails the notice).
- **The consumer's ack floor** (``consumer_info``, ~0.3 ms), which moves only
  over a contiguous run of acks, and a worker acks only after its commit. It
  is the fallback for what notices cannot say: a lost notice (core NATS, so
  a reconnect can drop some), sequences purged with a deleted session (no
  one finishes them), sequences finished before this process listened, or
  replicas that do not publish notices. It is read once at start, whenever a
  cached value is older than ``max_age_s`` (:meth:`CommitFloor.current`), and
  on a timer while anyone waits: one shared poll, ``poll_from_s`` after the
  first waiter and then every ``poll_max_s`` at most. Concurrent reads share
  one request.

Runs above the floor are kept merged, and at most ``max_runs`` of them: when
a gap persists (a lost notice nobody has waited on yet), the highest runs
are forgotten first. Forgetting only makes the floor lower, never wrong.

The indexing floor (search's ``min_seq``) is the same over the indexing
durable: each indexing batch announces what it acked (indexed, skipped for
having no text, or applied as a delete) on ``memq.v1.committed.<indexing
durable>``, so a search that waits for the caller's write goes the moment it
is indexed, and the ack floor is again only the fallback.
:func:`announce_finished` is what both workers publish with.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from memq.contracts.backoff import doubling
from memq.contracts.errors import NotCommitted
from memq.contracts.notices import CommitNotice, CommittedRanges

log = logging.getLogger("memq.commit_floor")

RATE_WINDOW_S = 30.0  # how far back CommitFloor.rate() looks


async def announce_finished(nc: NATS, subject: str, seqs: Iterable[int], changed: Iterable[CommitNotice] = ()) -> None:
    """Say which stream sequences a replica finished with in one batch
    (after their acks, on the same connection, so the notice never
    overtakes them): one :class:`CommittedRanges` on ``subject``, its
    durable's and stream's (:func:`memq.workers.runtime.event_streams.notice_subject`),
    whatever the batch held. Nothing when nothing was finished; a failed
    publish is only logged (readers fall back to the ack floor)."""
    seqs = list(seqs)
    if not seqs:
        return
    notice = CommittedRanges.of(seqs, changed)
    try:
        await nc.publish(subject, notice.encode())
    except NatsError as exc:
        log.warning("cannot announce finished sequences on %s (%s)", subject, exc or type(exc).__name__)


class ContiguousFloor:
    """The highest N such that every sequence in (0, N] is known done, from
    a base that only grows (:meth:`raise_to`, the ack floor) and runs of done
    sequences reported in any order, repeated or overlapping (:meth:`add`)."""

    def __init__(self, max_runs: int = 4096):
        self.value = 0
        self.max_runs = max_runs
        # Disjoint, non-adjacent runs wholly above value + 1, ascending.
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The runs known above the floor (waiting for a gap to close)."""
        return list(zip(self._firsts, self._lasts, strict=True))

    def add(self, first: int, last: int) -> bool:
        """Record that every sequence in [first, last] is done; True if the floor moved."""
        if last <= self.value or first > last:
            return False
        first = max(first, self.value + 1)
        # Merge with every run that overlaps or touches [first, last].
        lo = bisect_left(self._lasts, first - 1)
        hi = bisect_right(self._firsts, last + 1)
        if lo < hi:
            first = min(first, self._firsts[lo])
            last = max(last, self._lasts[hi - 1])
        self._firsts[lo:hi] = [first]
        self._lasts[lo:hi] = [last]
        if len(self._firsts) > self.max_runs:
            # A gap nobody has closed yet: forget the highest runs (the
            # fallback refresh moves the floor past them later).
            del self._firsts[self.max_runs :], self._lasts[self.max_runs :]
        return self._advance()

    def raise_to(self, base: int) -> bool:
        """Every sequence up to ``base`` is done (the ack floor); True if the floor moved."""
        if base <= self.value:
            return False
        self.value = base
        done = bisect_right(self._lasts, base)  # runs wholly at or below the new floor
        del self._firsts[:done], self._lasts[:done]
        self._advance()
        return True

    def _advance(self) -> bool:
        if not self._firsts or self._firsts[0] > self.value + 1:
            return False
        self.value = max(self.value, self._lasts[0])
        del self._firsts[0], self._lasts[0]
        return True  # runs never touch each other, so the next one is past a gap


class CommitFloor:
    """The commit floor of one durable consumer (see the module doc): what a
    read with ``min_seq`` waits on, and what a cache entry is as of.
    ``done`` is what its worker does to a sequence, for the error a wait
    that times out raises ("committed", or "indexed" for the indexing floor)."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        durable: str,
        max_age_s: float = 0.2,
        *,
        poll_from_s: float = 0.001,
        poll_max_s: float = 0.05,
        max_runs: int = 4096,
        done: str = "committed",
    ):
        self.js = js
        self.stream = stream
        self.durable = durable
        self.max_age_s = max_age_s
        self.poll_from_s = poll_from_s
        self.poll_max_s = poll_max_s
        self.done = done
        self.consumer_missing = False  # the last read found no such consumer: its worker never ran
        self._floor = ContiguousFloor(max_runs)
        self._read_at = 0.0
        self._refreshing: asyncio.Task | None = None
        # Waiters: (seq, tie-breaker, future) in a heap, woken in sequence order.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._waiting = 0
        self._poller: asyncio.Task | None = None
        self._poll_error: Exception | None = None
        self._moves: deque[tuple[float, int]] = deque()  # (time.monotonic(), floor) as it moved, for rate()

    @property
    def value(self) -> int:
        """The floor as known now, without I/O."""
        return self._floor.value

    # --- what moves the floor -------------------------------------------------------

    def finished(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Sequences a persistence replica finished with (a notice's runs)."""
        moved = False
        for first, last in ranges:
            moved = self._floor.add(first, last) or moved
        if moved:
            self._wake()

    def rate(self, now: float | None = None) -> float:
        """How fast the floor moved lately: sequences a second over the last
        RATE_WINDOW_S (0 when it has not moved in that time). What an ETA
        for a backlog is computed with."""
        now = time.monotonic() if now is None else now
        moves = self._moves
        while moves and now - moves[0][0] > RATE_WINDOW_S:
            moves.popleft()
        if not moves:
            return 0.0
        first_at, first = moves[0]
        return (self.value - first) / max(now - first_at, 1.0)

    async def refresh(self) -> int:
        """Re-read the ack floor; concurrent callers share one request."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._read())
        return await asyncio.shield(self._refreshing)

    async def _read(self) -> int:
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
        except NotFoundError:  # that worker has never run: nothing is done yet
            self.consumer_missing = True
            self._read_at = time.monotonic()
            return self.value
        self.consumer_missing = False
        if self._floor.raise_to(info.ack_floor.stream_seq if info.ack_floor else 0):
            self._wake()
        self._read_at = time.monotonic()
        return self.value

    async def current(self) -> int:
        """The floor, at most ``max_age_s`` old (what a cache entry is as of)."""
        if time.monotonic() - self._read_at > self.max_age_s:
            await self.refresh()
        return self.value

    # --- waiting ----------------------------------------------------------------------

    async def wait_for(self, seq: int, timeout_s: float) -> int:
        """Return once ``seq`` is committed (indexed: see ``done``), else
        raise NotCommitted (or, if the fallback could not read the consumer,
        what reading it raised)."""
        if self.value >= seq:
            return self.value
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._order), waiter))
        self._waiting += 1
        if self._poller is None or self._poller.done():
            self._poll_error = None
            self._poller = asyncio.create_task(self._poll(), name=f"commit floor {self.durable}")
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            if self.value >= seq:  # moved in the same loop turn
                return self.value
            if self._poll_error is not None:
                raise self._poll_error from None
            why = f"; consumer {self.durable} does not exist: is its worker running?" if self.consumer_missing else ""
            raise NotCommitted(
                f"sequence {seq} is not {self.done} yet ({self.done} up to {self.value}) after {timeout_s:.1f}s{why}"
            ) from None
        finally:
            self._waiting -= 1
            waiter.cancel()  # a no-op once woken
            self._forget_gone_waiters()
        return self.value

    def _wake(self) -> None:
        now = time.monotonic()
        moves = self._moves
        if not moves or now - moves[-1][0] >= 0.1:  # a sample per 100 ms is enough
            moves.append((now, self.value))
            while now - moves[0][0] > RATE_WINDOW_S:
                moves.popleft()
        while self._waiters and self._waiters[0][0] <= self.value:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)

    def _forget_gone_waiters(self) -> None:
        # Waiters that timed out stay in the heap until the floor passes
        # them; while it is stuck, drop them so the heap stays small.
        if len(self._waiters) > 2 * self._waiting + 64:
            self._waiters = [w for w in self._waiters if not w[2].done()]
            heapq.heapify(self._waiters)

    async def _poll(self) -> None:
        """The fallback: re-read the ack floor while anyone waits."""
        for attempt in itertools.count():
            if not self._waiting:
                return
            await asyncio.sleep(doubling(attempt, self.poll_from_s, self.poll_max_s))
            if not self._waiting:
                return
            try:
                await self.refresh()
                self._poll_error = None
            except Exception as exc:  # JetStream unavailable: waiters time out and say so
                log.debug("reading the %s ack floor failed: %s", self.durable, exc)
                self._poll_error = exc
