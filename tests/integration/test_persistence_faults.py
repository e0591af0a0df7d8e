"""Nothing is lost: a replica killed mid-batch, and PostgreSQL going away."""

from __future__ import annotations

import asyncio
import time

from helpers import (
    WorkerProcess,
    event_counts,
    make_settings,
    migrated_engine,
    running_worker,
    wait_for,
    wait_for_consumer,
)
from services import Postgres, running

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers import metrics
from memq.workers.sql import reads

APP = "faults"


def events(n: int, tag: str) -> list[Event]:
    return [Event(message=Message(role="user", parts=[TextPart(text=f"{tag} {i}")])) for i in range(n)]


async def _exactly(engine, n: int) -> bool:
    rows, distinct = await event_counts(engine)
    assert rows == distinct, f"{rows - distinct} duplicate rows"
    assert rows <= n
    return rows == n


async def test_sigkill_one_of_three_replicas_mid_batch(nats_url, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path, batch_size=50, ack_wait_s=2.0)
    engine = await migrated_engine(pg_url)  # migrate once, before three processes race to
    replicas = [WorkerProcess(settings, tmp_path / f"worker{i}.log").start() for i in range(3)]
    sessions = {f"s{i}": events(1000, f"s{i}") for i in range(20)}
    total = sum(len(v) for v in sessions.values())
    try:
        await wait_for_consumer(nats_url)  # the processes create the stream as they start

        async def some_committed() -> bool:
            return (await event_counts(engine))[0] >= total // 20

        async with await MemoryClient.connect(nats_url, app=APP) as client:
            # The kill comes while the events are still being published: the
            # replicas commit about as fast as one client publishes.
            publishing = asyncio.gather(*(client.append_many("u", s, evs) for s, evs in sessions.items()))
            await wait_for(some_committed, timeout=120, what="a twentieth of the events")
            replicas[0].kill()  # no chance to finish or ack the batch in hand
            killed_at = (await event_counts(engine))[0]
            await publishing
        assert killed_at < total, "too late: everything was already committed"
        replicas[0] = WorkerProcess(settings, tmp_path / "worker0-restarted.log").start()
        await wait_for(lambda: _exactly(engine, total), timeout=300, what="every event exactly once")
        for session, evs in sessions.items():
            stored = await reads.events(engine, APP, "u", session)
            assert [e.event_id for e in stored] == [e.id for e in evs]
    except BaseException:
        for r in replicas:
            print(r.log_tail())
        raise
    finally:
        for r in replicas:
            r.stop()
        await engine.dispose()


async def test_postgres_outage_while_publishing_loses_nothing(nats_url, postgres, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path, batch_size=100)
    published: list[str] = []
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:

            async def publish(rounds: int) -> None:
                for r in range(rounds):
                    batch = events(100, f"round {r}")
                    await client.append_many("u", "outage", batch)
                    published.extend(e.id for e in batch)
                    await asyncio.sleep(0.05)

            await publish(10)
            await wait_for(lambda: _exactly(worker.live.engine, 1000), timeout=60, what="first 1000 events")
            postgres.stop()
            try:
                await publish(20)  # publishing needs only NATS
                await asyncio.sleep(2)  # the worker naks and retries meanwhile
            finally:
                postgres.restart()
            await publish(10)
        await wait_for(
            lambda: _exactly(worker.live.engine, len(published)), timeout=120, what="every event after restart"
        )
        stored = await reads.events(worker.live.engine, APP, "u", "outage")
        assert [e.event_id for e in stored] == published


HOLD_S = 20.0  # the retry delay: far longer than the outage


async def test_commits_resume_soon_after_the_database_returns(nats_url, tmp_path):
    """The worker asks the database while it holds a failed batch: commits
    resume about half a second after PostgreSQL is back, not when the retry
    delay has passed (with [.., 10, 30] by default, a 4 s outage could cost 30 s)."""
    retried = metrics.EVENTS_PROCESSED.labels("persistence", "retried")
    with running(Postgres) as pg:
        url = pg.create_database("resume")
        settings = make_settings(nats_url, url, tmp_path, retry_delays_s=[HOLD_S], ack_wait_s=3 * HOLD_S)
        async with running_worker(settings) as worker:
            async with await MemoryClient.connect(nats_url, app=APP) as client:
                await client.append_many("u", "resume", events(10, "before"))
                await wait_for(lambda: _exactly(worker.live.engine, 10), timeout=60, what="the first events")
                pg.kill()
                failed = retried._value.get()
                await client.append_many("u", "resume", events(10, "during"))

                async def holding() -> bool:
                    return retried._value.get() > failed

                await wait_for(holding, timeout=30, what="a commit failing")
                await asyncio.to_thread(pg.start)
                back = time.monotonic()
                await wait_for(lambda: _exactly(worker.live.engine, 20), timeout=2 * HOLD_S, what="the held events")
                took = time.monotonic() - back
    print(f"committed {took:.1f}s after PostgreSQL was back")
    assert took < HOLD_S / 2, f"commits resumed {took:.1f}s after PostgreSQL was back"
