"""The commit floor (memq.workers.runtime.commit_floor): runs of finished sequences
from any number of replicas, in any order, never move the floor past a
sequence nobody has finished; the ack floor closes the gaps notices leave."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js.errors import NotFoundError

from memq.contracts.errors import NotCommitted
from memq.contracts.notices import CommittedRanges
from memq.workers.runtime.commit_floor import CommitFloor, ContiguousFloor


def test_runs_out_of_order_move_the_floor_only_when_the_gap_closes():
    f = ContiguousFloor()
    assert not f.add(4, 6)
    assert not f.add(9, 9)
    assert f.value == 0 and f.runs == [(4, 6), (9, 9)]
    assert f.add(1, 2)
    assert f.value == 2  # 3 is missing: 4..6 and 9 wait
    assert f.add(3, 3)
    assert f.value == 6 and f.runs == [(9, 9)]
    assert f.add(7, 8)
    assert f.value == 9 and f.runs == []


def test_duplicates_and_overlaps_change_nothing_twice():
    f = ContiguousFloor()
    f.add(5, 10)
    f.add(5, 10)
    f.add(7, 12)
    f.add(1, 3)
    assert f.runs == [(5, 12)] and f.value == 3
    assert not f.add(2, 3)  # at or below the floor
    f.add(4, 4)
    assert f.value == 12 and f.runs == []
    assert not f.add(1, 12)


def test_adjacent_runs_merge():
    f = ContiguousFloor()
    f.add(10, 12)
    f.add(14, 15)
    f.add(13, 13)
    assert f.runs == [(10, 15)]


def test_the_ack_floor_closes_a_gap_no_notice_will_fill():
    f = ContiguousFloor()
    f.add(1, 4)
    f.add(8, 20)  # 5..7 purged with a deleted session, or a notice was lost
    assert f.value == 4
    assert f.raise_to(7)
    assert f.value == 20 and f.runs == []
    assert not f.raise_to(15)  # an older ack floor never lowers it
    assert f.value == 20


def test_the_ack_floor_lands_inside_a_run():
    f = ContiguousFloor()
    f.add(3, 5)
    f.add(10, 12)
    f.raise_to(4)
    assert f.value == 5 and f.runs == [(10, 12)]


def test_runs_above_the_floor_are_bounded_and_forgetting_only_lowers_it():
    f = ContiguousFloor(max_runs=3)
    for seq in range(2, 20, 2):  # 9 runs, each after a gap
        f.add(seq, seq)
    assert f.runs == [(2, 2), (4, 4), (6, 6)]
    f.add(1, 1)
    f.add(3, 3)
    f.add(5, 5)
    assert f.value == 6  # the forgotten runs (8, 10, ...) are not counted
    f.raise_to(18)
    assert f.value == 18


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 200),
    missing=st.sets(st.integers(1, 200), max_size=5),
    batch=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    max_runs=st.integers(1, 50),
)
def test_the_floor_never_passes_a_missing_sequence(n, missing, batch, seed, max_runs):
    # Replicas finish batches of sequences in any order and repeat some;
    # a few sequences are never reported.
    rng = random.Random(seed)
    seqs = [s for s in range(1, n + 1) if s not in missing]
    batches = [seqs[i : i + batch] for i in range(0, len(seqs), batch)]
    batches += rng.sample(batches, k=min(3, len(batches)))  # redeliveries
    rng.shuffle(batches)
    f = ContiguousFloor(max_runs=max_runs)
    first_missing = min((s for s in missing if s <= n), default=n + 1)
    for b in batches:
        rng.shuffle(b)
        for first, last in CommittedRanges.of(b).ranges:
            f.add(first, last)
        assert f.value < first_missing
    if max_runs >= len(batches) + 1:
        assert f.value == first_missing - 1  # nothing forgotten: as far as it can go


# --- CommitFloor: waiting ------------------------------------------------------------


class FakeJetStream:
    """consumer_info with a settable ack floor, counting the reads."""

    def __init__(self, ack_floor: int = 0, exists: bool = True):
        self.ack_floor = ack_floor
        self.exists = exists
        self.reads = 0
        self.error: Exception | None = None

    async def consumer_info(self, stream: str, durable: str):
        self.reads += 1
        if self.error is not None:
            raise self.error
        if not self.exists:
            raise NotFoundError
        return SimpleNamespace(ack_floor=SimpleNamespace(stream_seq=self.ack_floor))


def floor(js: FakeJetStream, poll_s: float = 0.05) -> CommitFloor:
    return CommitFloor(js, "S", "d", poll_from_s=poll_s, poll_max_s=poll_s)  # type: ignore[arg-type]


async def test_a_notice_wakes_a_waiter_at_once_without_reading_the_consumer():
    js = FakeJetStream()
    cf = floor(js, poll_s=5.0)
    waiting = asyncio.create_task(cf.wait_for(3, timeout_s=5))
    await asyncio.sleep(0.01)
    started = time.monotonic()
    cf.finished([(2, 3)])  # 1 is missing
    await asyncio.sleep(0.01)
    assert not waiting.done()
    cf.finished([(1, 1)])
    assert await waiting == 3
    assert time.monotonic() - started < 0.5
    assert js.reads == 0


async def test_waiters_wake_in_sequence_order_as_the_floor_passes_them():
    cf = floor(FakeJetStream(), poll_s=5.0)
    low = asyncio.create_task(cf.wait_for(2, timeout_s=5))
    high = asyncio.create_task(cf.wait_for(5, timeout_s=5))
    await asyncio.sleep(0.01)
    cf.finished([(1, 3)])
    await asyncio.sleep(0.01)
    assert low.done() and not high.done()
    cf.finished([(4, 5)])
    assert await high == 5


async def test_the_fallback_reads_the_ack_floor_while_someone_waits():
    js = FakeJetStream(ack_floor=0)
    cf = floor(js, poll_s=0.02)
    waiting = asyncio.create_task(cf.wait_for(10, timeout_s=5))
    cf.finished([(8, 12)])  # 1..7 never announced (acked before this process listened)
    await asyncio.sleep(0.05)
    assert not waiting.done()
    js.ack_floor = 7
    assert await waiting == 12
    reads = js.reads
    await asyncio.sleep(0.1)
    assert js.reads == reads  # nobody waits: no more polling


async def test_a_waiter_gives_up_with_not_committed():
    js = FakeJetStream(ack_floor=3)
    cf = floor(js, poll_s=0.01)
    with pytest.raises(NotCommitted, match="committed up to 3"):
        await cf.wait_for(4, timeout_s=0.1)
    assert cf._waiters == [] or all(w[2].done() for w in cf._waiters)


async def test_jetstream_unavailable_is_said_as_such():
    js = FakeJetStream()
    js.error = TimeoutError()
    cf = floor(js, poll_s=0.01)
    with pytest.raises(TimeoutError):
        await cf.wait_for(1, timeout_s=0.1)


async def test_a_consumer_that_never_ran_has_committed_nothing():
    cf = floor(FakeJetStream(exists=False), poll_s=0.01)
    assert await cf.refresh() == 0
    with pytest.raises(NotCommitted):
        await cf.wait_for(1, timeout_s=0.05)


async def test_many_timed_out_waiters_do_not_pile_up():
    cf = floor(FakeJetStream(), poll_s=1.0)
    for _ in range(5):
        await asyncio.gather(*(cf.wait_for(100 + i, timeout_s=0.01) for i in range(100)), return_exceptions=True)
    assert len(cf._waiters) <= 64  # the floor never moved, yet the gone waiters are dropped
