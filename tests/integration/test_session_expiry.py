"""Session expiry against a real stack (persistence with its sweeper,
indexing, query): with a short TTL an idle session disappears from SQL,
history and search, while an active one and an app that opted out stay."""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AsyncExitStack

import pytest
from helpers import make_settings, running, running_query, running_worker, wait_for

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotFound
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.persistence.expiry import SessionSweeper
from memq.workers.settings import ExpirySettings
from memq.workers.sql import reads

APP = "expiring-app"
KEPT = "kept-app"  # its own TTL is null: never expires

pytestmark = pytest.mark.timeout(300)


def said(text: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))


def test_ttl_per_app_over_the_default():
    expiry = ExpirySettings(session_ttl_s=60, apps={"fast": 5, "forever": None})
    assert (expiry.ttl_for("fast"), expiry.ttl_for("forever"), expiry.ttl_for("other")) == (5, None, 60)
    assert expiry.enabled and not ExpirySettings().enabled
    assert ExpirySettings(apps={"fast": 5}).enabled  # an override alone turns it on for that app


async def test_idle_session_expires_everywhere_active_one_stays(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.expiry = ExpirySettings(session_ttl_s=5.0, apps={KEPT: None}, sweep_interval_s=0.3, lease_ttl_s=3.0)
    s.indexing = type(s.indexing).model_validate(
        {**s.indexing.model_dump(), "embedder": "none", "backend": "embedded", "batch_wait_s": 0.05}
    )
    async with AsyncExitStack() as stack:
        persistence = await stack.enter_async_context(running_worker(s))
        indexing = await stack.enter_async_context(running(IndexingWorker(s)))
        await asyncio.wait_for(indexing.ready.wait(), 60)
        await stack.enter_async_context(running_query(s))
        client = await stack.enter_async_context(await MemoryClient.connect(nats_url, app=APP))
        kept = await stack.enter_async_context(await MemoryClient.connect(nats_url, app=KEPT))

        await client.append("alice", "idle", said("zebra crossing notes from the idle session"))
        await client.append("alice", "active", said("zebra stripes in the active session"))
        seq = await kept.append("alice", "old", said("zebra in an app that keeps its sessions"))

        async def keep_writing() -> None:
            while True:
                await client.append("alice", "active", said(f"still here at {time.time()}"))
                await asyncio.sleep(0.3)

        writer = asyncio.create_task(keep_writing())
        try:
            # Indexed well within the TTL (a keyword-only index), so its removal below means something.
            await wait_for(lambda: _found(client, "idle"), timeout=4, what="the idle session indexed")
            engine = persistence.live.engine
            await wait_for(
                lambda: _gone(engine, APP, "idle"), timeout=30, what="the idle session deleted by the sweeper"
            )
            await asyncio.sleep(1.0)  # a few more sweeps
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        assert persistence.live.sweeper is not None and persistence.live.sweeper.expired >= 1
        assert await reads.session_exists(engine, APP, "alice", "active")
        assert await reads.session_exists(engine, KEPT, "alice", "old")  # idle longer than the TTL, its app opted out
        assert await reads.count_events(engine, APP, "alice", "idle") == 0
        with pytest.raises(NotFound):
            await client.history("alice", "idle")
        assert len((await client.history("alice", "active")).events) >= 2
        await wait_for(lambda: _not_found(client, "idle"), what="the idle session gone from the index")
        assert await _found(client, "active")
        assert (await kept.search("alice", "zebra", mode="keyword", min_seq=seq)).results


async def _gone(engine, app: str, session: str) -> bool:
    return not await reads.session_exists(engine, app, "alice", session)


async def _found(client: MemoryClient, session: str) -> bool:
    results = await client.search("alice", "zebra", mode="keyword")
    return any(r.session_id == session for r in results.results)


async def _not_found(client: MemoryClient, session: str) -> bool:
    return not await _found(client, session)


async def test_one_sweeper_at_a_time(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.expiry = ExpirySettings(session_ttl_s=3600, sweep_interval_s=0.1, lease_ttl_s=1.5)
    async with running_worker(s) as first:
        sweepers = [SessionSweeper(s, first.nc, first.live.engine) for _ in range(2)]
        for sweeper in sweepers:
            sweeper.start()
        try:
            await asyncio.sleep(1.0)
            holding = [sweeper._holding for sweeper in sweepers]
            # The worker's own sweeper holds the lease (started first): these two wait.
            assert first.live.sweeper is not None and first.live.sweeper._holding and holding == [False, False]
            await first.live.sweeper.stop()  # released: one of the others takes over
            await wait_for(lambda: _one_holds(sweepers), timeout=10, what="a sweeper taking over")
        finally:
            for sweeper in sweepers:
                await sweeper.stop()


async def _one_holds(sweepers) -> bool:
    return sum(s._holding for s in sweepers) == 1
