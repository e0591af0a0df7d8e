"""A rebuild is the indexing fleet's work, and resumable (issue 32), on both
index backends: every indexing replica pulls from the rebuild's durable
consumer; a replica killed halfway (kill -9) leaves every doc indexed once;
a second replica takes a share (counted in docs each embedded); a killed
`memq index rebuild` is resumed by the next one; --restart starts over;
unfinished and abandoned generations are listed and dropped."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from contextlib import AsyncExitStack, asynccontextmanager

import nats
import pytest
from helpers import (
    MEMQ,
    SharedEmbedder,
    WorkerProcess,
    make_settings,
    running,
    settings_env,
    wait_for,
    weaviate_collection,
)

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.backends import open_backend
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing import replica as replica_module
from memq.workers.indexing.generations import drop_generations, list_generations
from memq.workers.indexing.indexer import Indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.rebuild_job import JobStore
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.runtime import bus
from memq.workers.runtime.lease import BUCKET as LEASES
from memq.workers.settings import LocalEmbedderSettings

APP = "fleet-app"
pytestmark = pytest.mark.timeout(400)
LEASE_TTL_S = 5.0
BACKENDS = ["embedded", pytest.param("weaviate", marks=pytest.mark.services)]


@pytest.fixture(scope="module")
def embedder():
    return LocalEmbedder(LocalEmbedderSettings())


class Slow(SharedEmbedder):
    """The shared model, each batch held ``delay_s`` longer: a replica that
    embeds slowly, so that the other replicas' share shows."""

    def __init__(self, inner, delay_s: float):
        super().__init__(inner)
        self.delay_s = delay_s

    async def embed(self, texts):
        await asyncio.sleep(self.delay_s)
        return await self.inner.embed(texts)


@pytest.fixture
def settings(nats_url, sqlite_url, tmp_path, request):
    extra = {}
    if request.param == "weaviate":
        server = request.getfixturevalue("weaviate_server")
        extra = {"weaviate": weaviate_collection(server, "F")}
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.indexing = type(s.indexing).model_validate(
        {
            **s.indexing.model_dump(),
            "backend": request.param,
            "context_turns": 0,  # no SQL: these tests are about the stream replay
            "batch_size": 8,  # many batches, so that the work spreads
            "batch_wait_s": 0.05,
            "ack_wait_s": 3.0,  # a killed replica's batch comes back soon
            "retry_delays_s": [0.2, 0.5],
            "rebuild_lease_ttl_s": LEASE_TTL_S,  # a killed CLI's lease is free soon, not after 30 s
            **extra,
        }
    )
    return s


def env_for(s) -> dict[str, str]:
    """The settings as MEMQ_* variables, for `memq` processes."""
    i = s.indexing
    env = {
        **settings_env(s),
        "MEMQ_INDEXING__BACKEND": i.backend,
        "MEMQ_INDEXING__CONTEXT_TURNS": "0",
        "MEMQ_INDEXING__BATCH_SIZE": str(i.batch_size),
        "MEMQ_INDEXING__ACK_WAIT_S": str(i.ack_wait_s),
        "MEMQ_INDEXING__REBUILD_LEASE_TTL_S": str(i.rebuild_lease_ttl_s),
        "MEMQ_LOG_LEVEL": "INFO",
    }
    if i.backend == "weaviate":
        env.update(
            MEMQ_INDEXING__WEAVIATE__URL=str(i.weaviate.url),
            MEMQ_INDEXING__WEAVIATE__GRPC_PORT=str(i.weaviate.grpc_port),
            MEMQ_INDEXING__WEAVIATE__COLLECTION=i.weaviate.collection,
        )
    return env


async def publish(s, n: int) -> None:
    nc = await nats.connect(s.nats.url)
    try:
        await bus.ensure_streams(nc.jetstream(), s.streams)
    finally:
        await nc.close()
    async with await MemoryClient.connect(s.nats.url, app=APP) as client:
        for k in range(4):
            events = [
                Event(author="user", message=Message(role="user", parts=[TextPart(text=f"fact number {i} of {k}")]))
                for i in range(k, n, 4)
            ]
            await client.append_many("u", f"s{k}", events)


@asynccontextmanager
async def coordinator(s, embedder):
    """What `memq index rebuild` opens: a NATS connection and an indexer."""
    nc = await nats.connect(s.nats.url)
    backend = open_backend(s)
    await backend.open()
    try:
        yield nc, Indexer(backend, embedder, max_message_bytes=s.streams.max_message_bytes)
    finally:
        await backend.close()
        await nc.close()


async def docs_once(backend, n: int) -> None:
    """The live generation holds each of the ``n`` events exactly once."""
    docs = [d async for d in backend.export()]
    assert len(docs) == n
    assert len({d.uuid for d in docs}) == len({d.seq for d in docs}) == n


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_second_replica_takes_a_share_of_the_rebuild(settings, embedder, monkeypatch):
    monkeypatch.setattr(replica_module, "FOLLOW_EVERY_S", 0.1)
    n = 240
    await publish(settings, n)
    async with AsyncExitStack() as stack:
        workers = []
        for _ in range(2):
            w = IndexingWorker(settings)
            workers.append(await stack.enter_async_context(running(w, embedder=Slow(embedder, 0.05))))
            await asyncio.wait_for(w.ready.wait(), 120)
        nc, indexer = await stack.enter_async_context(coordinator(settings, SharedEmbedder(embedder)))
        first = (await indexer.backend.live()).generation
        # Only the workers pull: the CLI's --no-pull.
        result = await rebuild(settings, nc, indexer, work=False)
        assert result.generation != first
        names = {w.prepared.follower.name for w in workers if w.prepared is not None}
        assert {s.replica for s in result.shares} == names, result.shares
        per_replica = sorted(s.docs for s in result.shares)
        print("docs embedded by each replica:", per_replica)
        assert per_replica[0] > 0  # both took a share
        assert sum(per_replica) == result.docs == n  # and none was embedded twice
        await docs_once(indexer.backend, n)


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_replica_killed_halfway_leaves_every_doc_once(settings, embedder, tmp_path):
    n = 400
    await publish(settings, n)
    async with coordinator(settings, Slow(embedder, 0.1)) as (nc, indexer):
        await rebuild(settings, nc, indexer)  # the first index, made by this process alone
        worker = WorkerProcess(settings, tmp_path / "indexing.log", kind="indexing", env=env_for(settings))
        worker.start().wait_ready(120)
        try:
            store = JobStore(nc.jetstream())
            task = asyncio.create_task(rebuild(settings, nc, indexer))

            async def worker_embedded() -> bool:
                job = await store.get()
                shares = await store.shares(job.generation) if job else []
                return any(s.replica.startswith("indexing-") and s.docs >= 16 for s in shares)

            await wait_for(worker_embedded, timeout=120, what="the worker's share")
            assert not task.done(), "the rebuild finished before the kill: nothing was tested"
            worker.kill()
            result = await asyncio.wait_for(task, 300)
        finally:
            worker.stop()
        killed = [s for s in result.shares if s.replica.startswith("indexing-")]
        assert killed and killed[0].docs > 0, result.shares
        await docs_once(indexer.backend, n)
        assert [g.generation for g in await indexer.backend.generations()] == [result.generation]


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_killed_cli_is_resumed_by_the_next_rebuild(settings, embedder, tmp_path):
    n = 400
    await publish(settings, n)
    env = {**env_for(settings), "COLUMNS": "200"}
    log = tmp_path / "cli.log"
    async with coordinator(settings, SharedEmbedder(embedder)) as (nc, indexer):
        with open(log, "wb") as out:
            cli = subprocess.Popen([str(MEMQ), "index", "rebuild"], env=env, stdout=out, stderr=out)
        try:
            store = JobStore(nc.jetstream())

            async def under_way() -> bool:
                assert cli.poll() is None, log.read_text()
                job = await store.get()
                return job is not None and sum(s.messages for s in await store.shares(job.generation)) >= 40

            await wait_for(under_way, timeout=180, what="the CLI's rebuild to be under way")
            cli.send_signal(signal.SIGKILL)
            cli.wait(10)
        finally:
            if cli.poll() is None:
                cli.kill()
        job = await store.get()
        killed = await store.shares(job.generation)
        done_before = sum(s.messages for s in killed)
        assert done_before < n, "the rebuild finished before the kill: nothing was tested"
        rows = await list_generations(indexer.backend, nc.jetstream(), settings)
        assert [(r.generation, r.state) for r in rows] == [(job.generation, "rebuilding")]
        # The CLI took the lease with the setting's TTL: the resume below waits that long, not 30 s.
        assert (await (await nc.jetstream().key_value(LEASES)).status()).ttl == LEASE_TTL_S
        notices: list[str] = []
        result = await rebuild(settings, nc, indexer, notice=notices.append)
        assert result.resumed and result.generation == job.generation
        assert any("resuming the unfinished rebuild" in t for t in notices), notices
        # This run replayed only what the killed one had left (its batches in
        # flight come again).
        mine = [s for s in result.shares if s.replica not in {k.replica for k in killed}]
        assert len(mine) == 1 and 0 < mine[0].messages <= n - done_before + 2 * settings.indexing.batch_size
        await docs_once(indexer.backend, n)


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_restart_starts_over_and_generations_are_listed_and_dropped(settings, embedder):
    n = 40
    await publish(settings, n)
    async with coordinator(settings, SharedEmbedder(embedder)) as (nc, indexer):
        backend, js = indexer.backend, nc.jetstream()
        live = (await rebuild(settings, nc, indexer)).generation
        # An unfinished rebuild: nobody pulls, and it is stopped (as a killed CLI).
        task = asyncio.create_task(rebuild(settings, nc, indexer, work=False))
        store = JobStore(js)

        async def job_recorded() -> bool:
            return await store.get() is not None

        await wait_for(job_recorded, what="the rebuild's job")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        unfinished = (await store.get()).generation
        abandoned = (await backend.create_generation(indexer.embedder.model, indexer.embedder.dim)).generation
        rows = {r.generation: r for r in await list_generations(backend, js, settings)}
        assert {g: r.state for g, r in rows.items()} == {
            live: "live",
            unfinished: "rebuilding",
            abandoned: "abandoned",
        }
        assert rows[live].docs == n and rows[unfinished].docs == 0
        assert f"{n} messages left" in rows[unfinished].note

        cli = await asyncio.to_thread(
            subprocess.run,
            [str(MEMQ), "index", "generations", "--json"],
            env={**env_for(settings), "MEMQ_LOG_LEVEL": "WARNING"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        assert f'"{abandoned}"' in cli.stdout and '"abandoned"' in cli.stdout

        with pytest.raises(ValueError, match="live generation"):
            await drop_generations(backend, js, settings, [live])
        assert await drop_generations(backend, js, settings, [abandoned]) == [abandoned]

        notices: list[str] = []
        result = await rebuild(settings, nc, indexer, restart=True, notice=notices.append)
        # (Weaviate may give the new generation the dropped one's name.)
        assert not result.resumed and result.generation != live and result.replayed == n
        assert any("starting over" in t for t in notices), notices
        assert [g.generation for g in await backend.generations()] == [result.generation]
        assert result.docs == n
        names = {c.name for c in await js.consumers_info(settings.streams.events)}
        assert not any(name.startswith("memq-rebuild-") for name in names)  # nothing left behind

        # Dropping the unfinished rebuild's generation ends its job too.
        task = asyncio.create_task(rebuild(settings, nc, indexer, work=False))
        await wait_for(job_recorded, what="the rebuild's job")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        dropped = await drop_generations(backend, js, settings, None)
        assert len(dropped) == 1 and await store.get() is None


@pytest.mark.parametrize("settings", BACKENDS, indirect=True)
async def test_a_scoped_rebuild_keeps_what_other_users_wrote_during_it(settings, embedder, monkeypatch):
    """Before, a scoped rebuild replayed only its scope after copying the
    rest, so another user's event indexed live during it was missing from
    the new generation."""
    monkeypatch.setattr(replica_module, "FOLLOW_EVERY_S", 1000.0)  # the worker indexes live only
    await publish(settings, 20)
    async with AsyncExitStack() as stack:
        nc, indexer = await stack.enter_async_context(coordinator(settings, SharedEmbedder(embedder)))
        await rebuild(settings, nc, indexer)
        worker = await stack.enter_async_context(running(IndexingWorker(settings), embedder=SharedEmbedder(embedder)))
        await asyncio.wait_for(worker.ready.wait(), 120)
        store = JobStore(nc.jetstream())
        task = asyncio.create_task(rebuild(settings, nc, indexer, app=APP, user="u", work=False))

        async def job_recorded() -> bool:
            return await store.get() is not None

        await wait_for(job_recorded, what="the rebuild's job")
        async with await MemoryClient.connect(settings.nats.url, app=APP) as client:
            await client.append("v", "other", Event(message=Message(role="user", parts=[TextPart(text="v's fact")])))

        async def indexed_live() -> bool:
            return await indexer.backend.count(app=APP, user="v") == 1

        await wait_for(indexed_live, what="v's event in the live generation")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        result = await rebuild(settings, nc, indexer, app=APP, user="u")
        assert result.resumed and (await indexer.backend.live()).generation == result.generation
        assert await indexer.backend.count(app=APP, user="v") == 1
        assert await indexer.backend.count(app=APP, user="u") == 20
