"""The summarizer's commit-notice triggers: a notice that comes while the
session is being looked at is not lost (the look may have read the session
before that commit, and without a sweep nothing else would look again)."""

from __future__ import annotations

import asyncio

from memq.workers.settings import Settings
from memq.workers.summarizer.worker import SummarizerWorker


async def test_a_notice_that_comes_during_a_look_gets_a_look_of_its_own(tmp_path):
    worker = SummarizerWorker(Settings(data_dir=tmp_path))
    looks: list[int] = []
    reading = asyncio.Event()
    release = asyncio.Event()

    async def summarize_session(app: str, user: str, session: str) -> int | None:
        looks.append(len(looks))
        if len(looks) == 1:  # reads the session before the second commit
            reading.set()
            await release.wait()
        return None  # nothing due, as read

    worker.summarize_session = summarize_session  # type: ignore[method-assign]
    worker.schedule("a", "u", "s")  # the first commit's notice
    await reading.wait()
    worker.schedule("a", "u", "s")  # the second commit's, mid-look: dropped before
    worker.schedule("a", "u", "s")  # more of them still make one look
    release.set()
    for _ in range(100):
        if not worker._tasks:
            break
        await asyncio.gather(*list(worker._tasks))
    assert looks == [0, 1]


async def test_a_look_with_no_notice_meanwhile_ends_there(tmp_path):
    worker = SummarizerWorker(Settings(data_dir=tmp_path))
    looks: list[int] = []

    async def summarize_session(app: str, user: str, session: str) -> int | None:
        looks.append(len(looks))
        return None

    worker.summarize_session = summarize_session  # type: ignore[method-assign]
    worker.schedule("a", "u", "s")
    while worker._tasks:
        await asyncio.gather(*list(worker._tasks))
    assert looks == [0]
