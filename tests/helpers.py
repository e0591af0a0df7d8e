"""Shared helpers of the integration suites: run persistence workers (in this
process or as real `memq worker` processes) and wait for SQL to catch up."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from sqlalchemy import func, select

from memq.workers.index.embedders.base import embed_queries
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.runtime.app import Process, needs_of
from memq.workers.runtime.resources import Resources
from memq.workers.settings import Settings
from memq.workers.sql import models
from memq.workers.sql.engine import create_engine, migrate

EVENTS = models.Event.__table__
MEMQ = Path(sys.prefix) / "bin" / "memq"


def make_settings(nats_url: str, db_url: str, data_dir: Path, **persistence) -> Settings:
    return Settings(
        data_dir=data_dir,
        nats={"url": nats_url},
        database={"url": db_url},
        persistence={"retry_delays_s": [0.2, 0.5, 1.0], **persistence},
    )


def weaviate_collection(server, prefix: str) -> dict[str, object]:
    """Weaviate settings for ``server`` with a collection of the test's own
    (a random name under ``prefix``), so that tests sharing the server never meet."""
    return {"url": server.url, "grpc_port": server.grpc_port, "collection": f"{prefix}{uuid.uuid4().hex[:10]}"}


def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings as MEMQ_* variables, for worker processes."""
    env = dict(os.environ)
    env.update(
        MEMQ_DATA_DIR=str(settings.data_dir),
        MEMQ_NATS__URL=settings.nats.url or "",
        MEMQ_DATABASE__URL=settings.database_url(),
        MEMQ_PERSISTENCE__BATCH_SIZE=str(settings.persistence.batch_size),
        MEMQ_PERSISTENCE__ACK_WAIT_S=str(settings.persistence.ack_wait_s),
        MEMQ_PERSISTENCE__RETRY_DELAYS_S="[0.2, 0.5, 1.0]",
        MEMQ_DATABASE__MIGRATE_ON_START=str(settings.database.migrate_on_start).lower(),
        MEMQ_LOG_LEVEL="WARNING",
    )
    return env


@asynccontextmanager
async def running(worker, *, index=None, embedder=None):
    """Run one worker component (any kind) as a worker process would: alone
    in its own FastStream app, on its own NATS connection; stop it after.
    ``index``, ``embedder``: the process's, instead of the ones the settings
    name (a model the test loaded once, a slowed-down one); closed with it."""
    resources = None
    if index is not None or embedder is not None:
        resources = Resources(worker.settings, needs_of([worker]), index=index, embedder=embedder)
    process = Process(worker.settings, [worker], resources=resources)
    try:
        await process.start()
        yield worker
    finally:
        await process.stop()


def running_worker(settings: Settings):
    return running(PersistenceWorker(settings))


def running_query(settings: Settings):
    from memq.workers.query.worker import QueryWorker

    return running(QueryWorker(settings))


async def run_memq(settings: Settings, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """Run `memq ARGS` against ``settings``' NATS, database and data dir (in a
    thread, so workers running in this loop keep serving it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(
        MEMQ_NATS__URL=settings.nats.url,
        MEMQ_DATABASE__URL=settings.database_url(),
        MEMQ_DATA_DIR=str(settings.data_dir),
        MEMQ_LOG_LEVEL="WARNING",
        COLUMNS="200",  # rich wraps at 80 columns when it is not on a terminal
    )
    return await asyncio.to_thread(
        subprocess.run, [str(MEMQ), *args], env=env, input=input, capture_output=True, text=True, timeout=120
    )


class WorkerProcess:
    """A real `memq worker <kind>` process (a replica); ``env`` adds variables."""

    def __init__(
        self, settings: Settings, log_path: Path, kind: str = "persistence", env: dict[str, str] | None = None
    ):
        self.env = {**settings_env(settings), **(env or {})}
        self.log_path = log_path
        self.kind = kind
        self.proc: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen([str(MEMQ), "worker", self.kind], env=self.env, stdout=log, stderr=log)
        return self

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Until the worker says it serves (`memq worker` prints a ready line
        once started, the indexing worker once its index is prepared)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while f"memq worker {self.kind} ready" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.kind} worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.kind} worker not ready within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, grace_s: float = 30.0) -> bool:
        """SIGTERM, then SIGKILL after ``grace_s``; True if it exited by itself."""
        if not self.proc or self.proc.poll() is not None:
            return True
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except (AttributeError, NameError, TypeError):  # a bug in the check: polling cannot mend it
            raise
        except Exception:  # the database may be restarting: keep polling
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def stays_false(check: Callable[[], Awaitable[bool]], within: float = 1.0, what: str = "condition") -> None:
    """Assert ``check`` stays false for ``within`` seconds (polled; fails as
    soon as it turns true). For what must never happen, after a barrier that
    makes it likely to have happened already if it were going to."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            raise AssertionError(f"{what} happened")
        await asyncio.sleep(0.05)
    assert not await check(), f"{what} happened"


class NoticesHandled:
    """The stream sequences whose commit notice ``query`` (a QueryWorker)
    has handled, by a spy on its ``committed``. A read may be answered once
    the persistence consumer's ack floor passed its sequence (the floor's
    poll), before the notice came: the notice, handled later, drops that
    cached answer. A test that counts cache hits waits for the notices."""

    def __init__(self, query) -> None:
        self.seqs: set[int] = set()
        handle = query.committed

        async def committed(notice, reads) -> None:
            await handle(notice, reads)
            self.seqs.update(seq for first, last in notice.ranges for seq in range(first, last + 1))

        query.committed = committed

    async def wait(self, seqs: Iterable[int], timeout: float = 60.0) -> None:
        want = set(seqs)

        async def handled() -> bool:
            return want <= self.seqs

        await wait_for(handled, timeout, "the query worker handling the commit notices")


async def event_counts(engine) -> tuple[int, int]:
    """(rows, distinct event ids) in the events table."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(func.count()).select_from(EVENTS))).scalar_one()
        distinct = (await conn.execute(select(func.count(func.distinct(EVENTS.c.event_id))))).scalar_one()
    return rows, distinct


async def migrated_engine(url: str):
    engine = create_engine(url)
    await migrate(engine)
    return engine


async def wait_for_consumer(nats_url: str, durable: str = "memq-persistence", timeout: float = 60.0) -> None:
    """Until worker processes have set up the streams and their durable consumer."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def exists() -> bool:
        try:
            await js.consumer_info("MEMQ_EVENTS", durable)
            return True
        except NotFoundError:
            return False

    try:
        await wait_for(exists, timeout=timeout, what=f"consumer {durable}")
    finally:
        await nc.close()


async def wait_committed(nats_url: str, seq: int, durable: str = "memq-persistence", timeout: float = 60.0) -> None:
    """Until every message up to stream sequence ``seq`` is committed: the
    persistence consumer's ack floor (contiguous) has reached it. A later
    write's commit alone says nothing of an earlier one: batches of one
    worker (``persistence.concurrency``) and of replicas commit out of order."""
    import nats

    from memq.contracts.subjects import EVENTS_STREAM

    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def reached() -> bool:
        return (await js.consumer_info(EVENTS_STREAM, durable)).ack_floor.stream_seq >= seq

    try:
        await wait_for(reached, timeout=timeout, what=f"commits up to seq {seq}")
    finally:
        await nc.close()


async def index_reached(client, seq: int, durable: str = "memq-indexing") -> bool:
    """Whether the indexing consumer's ack floor has reached ``seq``: every
    message up to it is in the index. A search's ``min_seq`` no longer says
    so: a search whose own user has nothing unindexed is answered at once
    (workers/query/stream_unindexed.py), so searching as an idle user waits for nothing."""
    from memq.contracts.subjects import EVENTS_STREAM

    info = await client.nc.jetstream().consumer_info(EVENTS_STREAM, durable)
    return info.ack_floor.stream_seq >= seq


async def wait_indexed(client, seq: int, durable: str = "memq-indexing", timeout: float = 60.0) -> None:
    """Until everything up to ``seq`` is indexed (:func:`index_reached`)."""
    await wait_for(lambda: index_reached(client, seq, durable), timeout=timeout, what=f"indexing up to seq {seq}")


class Letters:
    """A tiny deterministic embedder (no model to load): letter counts."""

    model, dim = "test:letters", 8

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [[float(sum(ord(c) % self.dim == i for c in t.lower())) + 0.1 for i in range(self.dim)] for t in texts]

    async def close(self) -> None:
        pass


class SharedEmbedder:
    """Lets several workers of one test share one loaded model (closing is a no-op)."""

    def __init__(self, inner):
        self.inner, self.model, self.dim = inner, inner.model, inner.dim

    async def embed(self, texts):
        return await self.inner.embed(texts)

    async def embed_queries(self, texts):
        return await embed_queries(self.inner, texts)  # the inner model's query mode, where it has one

    async def close(self) -> None:
        pass


@contextmanager
def mcp_http(env: dict[str, str], app: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`memq mcp --transport http` for ``app`` on a free loopback port, with
    exactly ``env``: its URL, read from its ready line, and its process."""
    command = [str(MEMQ), "mcp", "--transport", "http", "--port", "0", "--app", app, "--user", "u"]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline, lines = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, f"memq mcp exited: {''.join(lines)}"
            lines.append(line)
            if found := re.search(r"ready: app \S+ on (http://\S+)", line):
                break
        else:
            raise AssertionError(f"memq mcp not ready: {''.join(lines)}")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe from filling
        yield found[1], proc
    finally:
        proc.terminate()
        proc.wait(30)
