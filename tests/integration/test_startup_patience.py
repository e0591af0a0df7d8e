"""Workers that start while JetStream is briefly unavailable (a cluster still
electing its leaders, as tests/faults saw on a fresh 3-node cluster) wait for
it or do without, rather than exit: a JetStream request that times out at
start is tried again where the worker cannot start without it (the durable
consumer) and skipped where it is only a head start (the query worker's
first read of the commit floor)."""

from __future__ import annotations

import nats
import pytest
from helpers import make_settings, running_query, running_worker

from memq.contracts.client import MemoryClient
from memq.workers.runtime import bus
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.runtime.consumer import BatchConsumer

APP = "patience-app"


def failing_first(times: int, real):
    """``real``, but the first ``times`` calls time out as JetStream does."""
    calls = {"n": 0}

    async def call(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= times:
            raise nats.errors.TimeoutError
        return await real(*args, **kwargs)

    return call, calls


async def test_patiently_retries_what_is_transient_and_gives_up_after_its_patience(monkeypatch):
    delays: list[float] = []

    async def no_wait(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(bus.asyncio, "sleep", no_wait)

    async def answer() -> int:
        return 42

    call, calls = failing_first(2, answer)
    assert await bus.patiently("asking", call) == 42
    assert calls["n"] == 3 and delays == [0.5, 1.0]

    never, _ = failing_first(10**6, answer)
    with pytest.raises(nats.errors.TimeoutError):
        await bus.patiently("asking", never, patience_s=0.1)

    async def refused() -> int:  # not transient: raised at once
        raise nats.js.errors.BadRequestError

    delays.clear()
    with pytest.raises(nats.js.errors.BadRequestError):
        await bus.patiently("asking", refused)
    assert delays == []


async def test_persistence_worker_waits_for_its_consumer(monkeypatch, nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    call, calls = failing_first(1, BatchConsumer._create_consumer)
    monkeypatch.setattr(BatchConsumer, "_create_consumer", call)
    async with running_worker(settings), await MemoryClient.connect(nats_url, app=APP) as client:
        seq = await client.append_text("u", "s", "user", "hello")
        async with running_query(settings):
            history = await client.history("u", "s", min_seq=seq)
    assert calls["n"] == 2
    assert [e.seq for e in history.events] == [seq]


async def test_query_worker_starts_without_its_first_floor_read(monkeypatch, nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    call, calls = failing_first(1, CommitFloor.refresh)
    monkeypatch.setattr(CommitFloor, "refresh", call)
    async with running_worker(settings), await MemoryClient.connect(nats_url, app=APP) as client:
        seq = await client.append_text("u", "s", "user", "hello")
        async with running_query(settings):
            history = await client.history("u", "s", min_seq=seq)
    assert calls["n"] >= 2  # the failed head start, then the read that needed it
    assert [e.seq for e in history.events] == [seq]
