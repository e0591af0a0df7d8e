"""Setting up the events streams on a real nats-server: the shared stream by
default, and per-app streams once ``streams.apps`` lists apps, including the
move of a deployment that already has history in the shared stream
(workers/runtime/event_streams.py, workers/runtime/bus.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import nats
import pytest
from helpers import make_settings, running_query, running_worker
from nats.js.api import DiscardPolicy

from memq.contracts.client import MemoryClient
from memq.contracts.errors import QuotaExceeded
from memq.contracts.subjects import app_events_stream, events_subject
from memq.workers.cli.datadir import describe_backlog
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.runtime.bus import ensure_streams
from memq.workers.runtime.event_streams import RETIRED_SUBJECT, event_streams, stream_of
from memq.workers.settings import AppStreamSettings, StreamSettings

A, B = "app-a", "team.b"


@pytest.fixture
async def js(nats_url):
    nc = await nats.connect(nats_url)
    yield nc.jetstream()
    await nc.close()


async def test_apps_with_streams_of_their_own_continue_after_the_shared_history(js, nats_url) -> None:
    shared = StreamSettings()
    assert await ensure_streams(js, shared) == {
        "MEMQ_EVENTS": "created",
        "MEMQ_DLQ": "created",
        "MEMQ_ARTIFACTS": "created",
    }
    assert event_streams(shared) == ["MEMQ_EVENTS"] and stream_of(shared, A) == "MEMQ_EVENTS"
    async with await MemoryClient.connect(nats_url, app=A) as a:
        before = [await a.append_text("ann", "s", "user", f"shared {i}") for i in range(3)]
    assert before == [1, 2, 3]

    apps = StreamSettings(apps={A: AppStreamSettings(), B: AppStreamSettings(max_bytes=4096)}, app_max_bytes=1 << 20)
    result = await ensure_streams(js, apps)
    assert result["MEMQ_EVENTS"] == "updated"
    assert result[app_events_stream(A)] == result[app_events_stream(B)] == "created"
    assert event_streams(apps) == ["MEMQ_EVENTS", app_events_stream(A), app_events_stream(B)]

    old = await js.stream_info("MEMQ_EVENTS")
    assert old.config.subjects == [RETIRED_SUBJECT] and old.state.messages == 3  # history kept, nothing new
    for app, quota in ((A, 1 << 20), (B, 4096)):
        info = await js.stream_info(app_events_stream(app))
        assert info.config.max_bytes == quota and info.config.discard == DiscardPolicy.NEW
        assert info.state.first_seq == 4  # after the shared stream's last sequence: a session keeps its order

    # The same client code goes on, now into A's own stream (the first
    # refusal names the other stream; nothing was stored twice).
    async with await MemoryClient.connect(nats_url, app=A) as a:
        seq = await a.append_text("ann", "s", "user", "own stream")
        assert (seq, a.stream) == (4, app_events_stream(A))
    stored = await js.get_last_msg(app_events_stream(A), events_subject(A, "ann", "s"))
    assert stored.seq == 4 and (await js.stream_info(app_events_stream(A))).state.messages == 1
    assert (await js.stream_info("MEMQ_EVENTS")).state.messages == 3

    # B's quota: its next write past 4 KiB is refused, naming it.
    async with await MemoryClient.connect(nats_url, app=B) as b:
        with pytest.raises(QuotaExceeded, match=r"app 'team\.b'.s stream MEMQ_EVENTS_team~2Eb is full"):
            for i in range(10):
                await b.append_text("bob", "s", "user", f"{i} " + "x" * 1024)

    # Idempotent, and a quota change is applied to the running stream.
    assert set((await ensure_streams(js, apps)).values()) == {"unchanged"}
    raised = apps.model_copy(update={"apps": {A: AppStreamSettings(), B: AppStreamSettings(max_bytes=8192)}})
    assert (await ensure_streams(js, raised))[app_events_stream(B)] == "updated"
    assert (await js.stream_info(app_events_stream(B))).config.max_bytes == 8192


async def test_a_write_from_before_the_move_is_read_once_the_shared_stream_commits_it(
    js, nats_url, sqlite_url, tmp_path
) -> None:
    """An app moved to a stream of its own starts after the shared stream's
    history, so its floors pass an older seq at once: a read of a write made
    just before the move (still in the shared stream's backlog) waits on the
    shared stream's floor instead, and answers with the write, not without it."""
    shared = make_settings(nats_url, sqlite_url, tmp_path)
    await ensure_streams(js, shared.streams)
    async with await MemoryClient.connect(nats_url, app=A) as a:
        seq = await a.append_text("ann", "moved", "user", "written before the move")  # nothing commits it yet

    moved = shared.model_copy(update={"streams": StreamSettings(apps={A: AppStreamSettings()})})
    await ensure_streams(js, moved.streams)
    # The persistence fleet has its consumer on A's stream already (nothing
    # to commit there: its floor stands at the stream's start, past seq).
    config = PersistenceWorker(moved).consumer_config()
    await js.add_consumer(app_events_stream(A), replace(config, name=config.durable_name))
    async with running_query(moved):
        async with await MemoryClient.connect(nats_url, app=A, wait_ms=20_000, carry_writes=False) as a:
            read = asyncio.create_task(a.history("ann", "moved", min_seq=seq))
            await asyncio.sleep(1.0)
            assert not read.done(), f"answered before the write was committed: {read.result()!r}"
            async with running_worker(moved):
                history = await asyncio.wait_for(read, 20)
    assert [e.event["message"]["parts"][0]["text"] for e in history.events] == ["written before the move"]


async def test_the_ready_line_names_the_app_stream_a_backlog_is_in(js, nats_url, sqlite_url, tmp_path) -> None:
    """`memq up`'s backlog note with a stream per app: each stream's
    consumers are sampled, and a backlog says which stream it is in."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    settings.streams = StreamSettings(apps={A: AppStreamSettings(), B: AppStreamSettings()})
    await ensure_streams(js, settings.streams)
    config = PersistenceWorker(settings).consumer_config()
    for stream in event_streams(settings.streams):  # the fleet's consumers, nobody pulling
        await js.add_consumer(stream, replace(config, name=config.durable_name))
    async with await MemoryClient.connect(nats_url, app=A) as a:
        for i in range(3):
            await a.append_text("ann", "s", "user", f"waiting {i}")
    line = await describe_backlog(settings, wait_s=0.2)
    assert line.startswith(f"{app_events_stream(A)}: memq-persistence 3 waiting"), line
    assert app_events_stream(B) not in line and "MEMQ_EVENTS:" not in line
