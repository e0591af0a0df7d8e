"""Each service SIGKILLed under steady load, then restarted: one NATS node of a
3-node cluster (the stream leader's), PostgreSQL, Redis and Weaviate. Nothing
acked is lost or doubled, the index converges to SQL, and queries are never
wrong (only typed errors or late answers while the service is away)."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest
import redis.asyncio as aioredis

from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.index.backends.weaviate import WeaviateIndex
from memq.workers.memory.recall import SearchQuery

from .harness import Fault, Timing, run_fault

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

APP = "faults-services"


def server_fault(name: str, server) -> Fault:
    return Fault(f"SIGKILL {name}", server.kill, server.start)


async def stream_leader(servers: list[str], stream: str) -> str:
    nc = await nats.connect(servers)
    try:
        info = await nc.jetstream().stream_info(stream)
    finally:
        await nc.close()
    assert info.config.num_replicas == 3, info.config
    return info.cluster.leader


async def test_nats_stream_leader_killed(stack, nats_cluster, pg_url):
    st = stack(nats_cluster.url, pg_url, {"streams": {"replicas": 3}})
    for kind in ("persistence", "indexing", "query"):
        st.start(kind)
    killed = []

    async def kill() -> None:
        leader = await stream_leader(nats_cluster.url.split(","), st.settings.streams.events)
        [node] = [n for n in nats_cluster.nodes if n.server_name == leader]
        node.kill()
        killed.append(node)
        print(f"killed {leader}, the leader of {st.settings.streams.events}")

    fault = Fault("SIGKILL the NATS node leading the R3 stream", kill, lambda: killed[0].start())
    # The node's return disturbs the cluster too: while it catches up,
    # JetStream API requests (consumer info: the commit floor) time out for a
    # few seconds, so queries answer `unavailable` or late a little longer.
    report = await run_fault(st, fault, app=APP, search=True, timing=Timing(recover_s=15))
    report.assert_ok()


async def test_postgres_killed(stack, fresh_nats, own_postgres):
    st = stack(fresh_nats.url, own_postgres.create_database("faults"))
    for kind in ("persistence", "indexing", "query"):
        st.start(kind)
    report = await run_fault(st, server_fault("PostgreSQL", own_postgres), app=APP, search=True)
    report.assert_ok()


async def test_redis_killed(stack, fresh_nats, pg_url, own_redis):
    # Redis alone as the cache (no in-process tier in front), shared by two replicas.
    st = stack(fresh_nats.url, pg_url, {"cache": {"backend": "redis", "redis_url": own_redis.url, "local": False}})
    st.start("persistence")
    st.start("query", 2)
    cached = []

    async def kill() -> None:
        r = aioredis.from_url(own_redis.url)
        try:
            cached.append(len(await r.keys("memq:q:e:*")))  # answers cached there: the kill bites
        finally:
            await r.aclose()
        own_redis.kill()

    report = await run_fault(st, Fault("SIGKILL Redis", kill, own_redis.start), app=APP)
    if not cached[0]:
        report.problems.append("Redis held no cached answers when it was killed")
    report.assert_ok()


class SearchWatch:
    """A search through the backend from this process every 0.25 s, each in
    its own task (as requests come): how soon did a search started after
    Weaviate's return succeed?"""

    def __init__(self, settings):
        self.index = WeaviateIndex(settings.indexing.weaviate)
        self.query = SearchQuery(app=APP, user="user0", text="remember", mode="keyword")
        self.ok: list[tuple[float, float]] = []  # (started, answered)

    async def run(self) -> None:
        await self.index.open()
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                task = asyncio.create_task(self._one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(0.25)
        finally:
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.index.close()

    async def _one(self) -> None:
        started = time.monotonic()
        try:
            await self.index.search(self.query)
        except IndexUnavailable:
            return
        self.ok.append((started, time.monotonic()))

    def seconds_to_first_search_after(self, t: float) -> float:
        return min((done for started, done in self.ok if started >= t), default=float("inf")) - t


async def test_weaviate_killed(stack, fresh_nats, pg_url, own_weaviate):
    weaviate = {"url": own_weaviate.url, "grpc_port": own_weaviate.grpc_port, "collection": f"F{uuid.uuid4().hex[:10]}"}
    st = stack(fresh_nats.url, pg_url, {"indexing": {"backend": "weaviate", "weaviate": weaviate}})
    for kind in ("persistence", "indexing", "query"):
        st.start(kind)
    watch, back = SearchWatch(st.settings), []

    def restore() -> None:
        own_weaviate.start()
        back.append(time.monotonic())

    # Down long enough for gRPC's default reconnect backoff to grow to seconds
    # (GRPC_RECONNECT in workers/index/backends/weaviate.py). Recovery is
    # slower here: a batch insert in flight sits out the client's own retries
    # (up to 15 s), then the backlog is embedded.
    timing = Timing(down_s=8, recover_s=15)
    watcher = asyncio.create_task(watch.run())
    try:
        report = await run_fault(
            st, Fault("SIGKILL Weaviate", own_weaviate.kill, restore), app=APP, search=True, timing=timing
        )
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    reconnect_s = watch.seconds_to_first_search_after(back[0])
    print(f"a search through the backend worked again {reconnect_s:.1f}s after Weaviate was back")
    if reconnect_s > 3.0 * report.contention:
        report.problems.append(
            f"searches failed for {reconnect_s:.1f}s after Weaviate was back (CPU contention {report.contention:.1f})"
        )
    report.assert_ok()
