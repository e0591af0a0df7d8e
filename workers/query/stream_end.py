"""Whether a read's ``min_seq`` can ever be committed: the events stream's
last sequence.

A ``min_seq`` beyond anything the stream holds names a write nobody made:
waiting for it could only time out, after up to ``wait_ms`` (30 s) of a
caller's waiting read (issue 38: an app held every request slot that way).
Such a read is refused at once instead. A sequence at or below the last one
read is possible for good (the stream's sequences only grow), so the stream
is asked only about a sequence above it, and always by a read that began
after the request came: a sequence the caller has just had acknowledged is
never refused for an answer from before its publish. Concurrent askers
share one read (``STREAM.INFO``, ~0.3 ms), so a flood of impossible reads
costs one request per round trip, not one each.
"""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext


class StreamEnd:
    """The last sequence of ``stream``, as far as it has been read."""

    def __init__(self, js: JetStreamContext, stream: str):
        self.js = js
        self.stream = stream
        self.last = 0  # the highest last sequence read yet
        self._reading: asyncio.Future[int] | None = None
        self._started = 0.0  # when that read was asked (monotonic)

    async def reaches(self, seq: int) -> bool:
        """Whether the stream holds (or held: purges keep the count) sequence ``seq``."""
        if seq <= self.last:
            return True
        return seq <= await self._read_since(time.monotonic())

    async def _read_since(self, asked: float) -> int:
        """The last sequence from a read asked at ``asked`` or later."""
        while True:
            if self._reading is None or (self._reading.done() and self._started < asked):
                self._started = time.monotonic()
                self._reading = asyncio.ensure_future(self._read())
            reading = self._reading
            if self._started >= asked:
                return await asyncio.shield(reading)
            # A read asked before this request may miss the caller's publish:
            # wait it out, then the next one (shared by all who waited).
            try:
                await asyncio.shield(reading)
            except Exception:  # noqa: BLE001 - that read's outcome is not this one's
                pass

    async def _read(self) -> int:
        info = await self.js.stream_info(self.stream)
        self.last = max(self.last, info.state.last_seq)
        return self.last
