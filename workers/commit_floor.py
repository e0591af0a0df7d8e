"""Read-your-writes: is stream sequence N committed to SQL yet?

The persistence consumer's ack floor only advances over a contiguous run of
acks, and a worker acks only after its commit: ``ack floor >= N`` means every
message up to N is in SQL, whatever the number of replicas. ``consumer_info``
costs ~0.3 ms, so the floor is cached briefly and concurrent waiters share one
refresh.
"""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from memq.contracts.errors import NotCommitted


class CommitFloor:
    def __init__(self, js: JetStreamContext, stream: str, durable: str, max_age_s: float = 0.2):
        self.js = js
        self.stream = stream
        self.durable = durable
        self.max_age_s = max_age_s
        self.value = 0
        self._read_at = 0.0
        self._refreshing: asyncio.Task | None = None

    async def refresh(self) -> int:
        """Re-read the floor; concurrent callers share one request."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._read())
        return await asyncio.shield(self._refreshing)

    async def _read(self) -> int:
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
        except NotFoundError:  # that worker has never run: nothing is done yet
            self._read_at = time.monotonic()
            return self.value
        self.value = max(self.value, info.ack_floor.stream_seq if info.ack_floor else 0)
        self._read_at = time.monotonic()
        return self.value

    async def current(self) -> int:
        """The floor, at most ``max_age_s`` old (what a cache entry is as of)."""
        if time.monotonic() - self._read_at > self.max_age_s:
            await self.refresh()
        return self.value

    async def wait_for(self, seq: int, timeout_s: float) -> int:
        """Return once ``seq`` is committed, else raise NotCommitted."""
        if self.value >= seq:
            return self.value
        deadline = time.monotonic() + timeout_s
        delay = 0.001
        while True:
            if await self.refresh() >= seq:
                return self.value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NotCommitted(
                    f"sequence {seq} is not committed yet (committed up to {self.value}) after {timeout_s:.1f}s"
                )
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
