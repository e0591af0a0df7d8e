"""The events stream's last sequence, as the query worker learns it to refuse
a ``min_seq`` that can never be committed (workers/query/stream_end.py): a
sequence acknowledged before the question is never refused, askers share
one read, and nobody's question is sent when nobody needs the answer."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from fakes import query_live

from memq.contracts import queries as q
from memq.contracts.errors import InvalidRequest
from memq.workers.query.stream_end import StreamEnd
from memq.workers.query.worker import QueryWorker
from memq.workers.settings import Settings


class Stream:
    """JetStream's STREAM.INFO of a stream whose last sequence the test moves."""

    def __init__(self, last: int):
        self.last = last
        self.reads = 0

    async def stream_info(self, stream: str):
        self.reads += 1
        return SimpleNamespace(state=SimpleNamespace(last_seq=self.last))


async def test_what_was_read_needs_no_read_and_beyond_it_is_read_once_for_all():
    js = Stream(last=10)
    end = StreamEnd(js, "MEMQ_EVENTS", pause_s=0.01)  # type: ignore[arg-type]
    answers = await asyncio.gather(*(end.reaches(seq) for seq in (5, 11, 10, 10**12, 12)))
    assert answers == [True, False, True, False, False]
    assert js.reads == 1  # one read for all of them
    assert await end.reaches(10) and js.reads == 1  # known now: no read


async def test_a_sequence_published_before_the_question_is_never_refused():
    js = Stream(last=10)
    end = StreamEnd(js, "MEMQ_EVENTS", pause_s=0.01)  # type: ignore[arg-type]
    first = asyncio.ensure_future(end.reaches(11))
    await asyncio.sleep(0.05)  # that read is over
    assert not await first
    js.last = 11  # a caller's publish is acknowledged, then it asks
    assert await end.reaches(11)
    assert js.reads == 2


async def test_a_question_nobody_waits_for_is_never_sent():
    js = Stream(last=10)
    end = StreamEnd(js, "MEMQ_EVENTS", pause_s=0.05)  # type: ignore[arg-type]
    asking = asyncio.ensure_future(end.reaches(11))
    await asyncio.sleep(0)
    asking.cancel()  # the read's commit came first
    await asyncio.sleep(0.1)
    assert js.reads == 0
    assert not await end.reaches(11) and js.reads == 1  # a later question reads anew


class Floor:
    """A commit floor that moves when the test says."""

    value = 0

    def __init__(self) -> None:
        self.moved = asyncio.Event()

    async def wait_for(self, seq: int, timeout_s: float) -> int:
        async with asyncio.timeout(timeout_s):
            await self.moved.wait()
        return seq


def worker_on(js: Stream, floor: Floor, tmp_path) -> QueryWorker:
    worker = QueryWorker(Settings(data_dir=tmp_path, database={"url": "inmemory"}))
    end = StreamEnd(js, "MEMQ_EVENTS")  # type: ignore[arg-type]
    worker._live = query_live(floor, end=end)
    return worker


def read(min_seq: int) -> q.HistoryGet:
    return q.HistoryGet(app="a", user="u", session="s", min_seq=min_seq)


async def test_a_wait_for_a_sequence_never_written_ends_at_once(tmp_path):
    floor = Floor()
    worker = worker_on(Stream(last=10), floor, tmp_path)
    slot = worker.slots.admit("a", "history")
    started = time.monotonic()
    with pytest.raises(InvalidRequest, match=r"history: min_seq 1000000000000 is beyond .* last sequence 10"):
        await worker._wait("history", read(10**12), 30_000, floor, slot)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5  # not its 30 s
    assert worker.slots.waits.count("a") == 0 and not slot.held
    slot.close()


async def test_a_wait_whose_commit_comes_first_never_asks_the_stream(tmp_path):
    js, floor = Stream(last=10), Floor()
    worker = worker_on(js, floor, tmp_path)
    slot = worker.slots.admit("a", "history")
    floor.moved.set()  # the commit lands before the read's question would be sent
    await worker._wait("history", read(9), 30_000, floor, slot)  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    assert js.reads == 0
    assert slot.held  # back in a slot, to answer
    slot.close()
