"""Whether a read's ``min_seq`` can ever be committed: the events stream's
last sequence.

A ``min_seq`` beyond anything the stream holds names a write nobody made:
waiting for it could only time out, after up to ``wait_ms`` (30 s) of a
caller's waiting read (and an app once held every request slot that way).
Such a read is refused instead. A sequence at or below the last one read is
possible for good (the stream's sequences only grow), so the stream is
asked only about a sequence above it, and always by a read that begins after
the request came: a sequence the caller has just had acknowledged is never
refused for an answer from before its publish.

The question is asked beside the wait, not before it (the query worker's
``_wait``): a read-your-writes read is usually committed within a few
milliseconds, before any answer could come. So the reads are batched: one
``STREAM.INFO`` (~0.3 ms, a JSON parse) begins ``pause_s`` after the first
asker and answers everyone who asked before it began, and none is sent when
every asker's commit came first. A flood of impossible reads then costs one
request per pause, not one each (it was one each: 1,217 for 1,276 refusals).
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext


class _Read:
    """One batched read and how many askers still wait for it."""

    def __init__(self, task: asyncio.Task[int]):
        self.task = task
        self.askers = 0


class StreamEnd:
    """The last sequence of ``stream``, as far as it has been read."""

    def __init__(self, js: JetStreamContext, stream: str, pause_s: float = 0.02):
        self.js = js
        self.stream = stream
        self.pause_s = pause_s
        self.last = 0  # the highest last sequence read yet
        self._next: _Read | None = None  # the read not begun yet, which a new asker joins

    async def reaches(self, seq: int) -> bool:
        """Whether the stream holds (or held: purges keep the count) sequence ``seq``."""
        if seq <= self.last:
            return True
        read = self._next
        if read is None:
            read = self._next = _Read(asyncio.ensure_future(self._read_after_pause()))
        read.askers += 1
        try:
            return seq <= await asyncio.shield(read.task)
        finally:
            read.askers -= 1
            if not read.askers and not read.task.done():  # nobody needs it any more
                read.task.cancel()
                if self._next is read:
                    self._next = None

    async def _read_after_pause(self) -> int:
        await asyncio.sleep(self.pause_s)
        # Whoever asks from now on may have published after this read
        # begins: they join the next one.
        if self._next is not None and self._next.task is asyncio.current_task():
            self._next = None
        info = await self.js.stream_info(self.stream)
        self.last = max(self.last, info.state.last_seq)
        return self.last
