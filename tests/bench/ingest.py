"""Ingest benchmark: publish → commit throughput and latency of the persistence worker.

Usage::

    .venv/bin/python tests/run_bench.py ingest [--quick] [--json PATH]
        [--replicas 1,2,4] [--events N] [--sessions N] [--users N]
        [--databases postgresql,sqlite] [--backlog] [--peers]

``--peers`` (PostgreSQL) adds LangChain's ``PostgresChatMessageHistory``
writing the same messages beside the direct asyncpg insert; it needs
``.venv/bin/pip install langchain-postgres==0.0.19`` (not a memq dependency).

For example, replica scaling on PostgreSQL alone, on a many-core machine::

    .venv/bin/python tests/run_bench.py ingest --databases postgresql \
        --replicas 1,2,4,8 --events 100000 --sessions 1000 --users 1000

Everything runs on loopback, on servers this script starts and stops itself
(``tests/services.py``): a fresh nats-server per configuration, one PostgreSQL
(a new database per configuration) and a new SQLite file per configuration.
Only nats-server and the databases: no Weaviate, no Redis, no embedder.

For each database (``--databases``; PostgreSQL and SQLite) and each replica
count N (``--replicas``; 1, 2, 4), N real ``memq worker persistence``
processes share the durable consumer, and:

(a) **throughput** — E events (``--events``; 20,000, ``--quick`` 3,000)
    across S sessions (``--sessions``; 50) of U users (``--users``; 10, session
    i belongs to user i mod U) are published with ``MemoryClient.append_many``,
    all sessions at once.
    Events/s runs from the first publish to the arrival of the last
    ``memq.v1.changed.>`` notice (the workers announce each commit with the
    highest committed seq of a session). Completion is confirmed with the
    consumer's ack floor, which only advances over a contiguous run of acks
    and so is exact even when replicas commit out of order.
    With ``--backlog`` the durable consumer is paused (JetStream consumer
    pause, nats-server ≥ 2.11) while the events are published, and events/s
    runs from its resume to the last commit: the workers drain a backlog
    with the machine to themselves. That measures the workers, not this
    script's one publishing client, which on many cores publishes slower
    than several replicas commit.
(b) **latency** — a paced run (1,000 events/s for 5 s; ``--quick`` 500/s for
    2 s) across 10 sessions (of the same U users), one ``client.append`` per
    event. t0 is taken just before each publish; the commit time of seq s is
    the arrival of the replicas' ``memq.v1.committed`` notice that names s
    (exact with any number of replicas). p50 and p99 in ms. "Reordered"
    counts the ``memq.v1.changed`` notices that arrived below their
    session's high mark: another replica committed a newer batch of the
    session first. A worker tops a batch up for at most ``batch_wait_s``
    (20 ms) while the stream keeps delivering, so that wait can be part of
    the latency.

Afterwards SQL must hold exactly the published events (rows and distinct ids
in ``memq_events``); the table flags any difference.

Baselines in the same run, on a nats-server of their own: raw nats-py
JetStream publishes of the same encoded payloads (same ``Nats-Msg-Id``
headers, subjects moved to a scratch stream) with ``js.publish_async``
pipelined and with ``js.publish`` awaited one by one, and
``MemoryClient.append_many`` publishing into ``MEMQ_EVENTS`` with no worker.
Ratios are against raw ``publish_async``.

Around the throughput run and the baselines the script reads the CPU time of
every process on the machine (``/proc/<pid>/stat``) and reports CPU ms per
1,000 events by process: this script (the publishing client and the notice
watcher), the workers, nats-server, PostgreSQL's backends and the rest.

Workers get SIGTERM at the end of a configuration, after the checks, and
SIGKILL if they have not exited 5 s later (so a slow shutdown cannot stretch
the run; the script says when it had to).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import defaultdict
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import asyncpg
import helpers
import nats
import orjson
import services
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError
from rich.table import Table

from bench.benchlib import (
    CommitClock,
    console,
    cpu_between,
    machine_info,
    percentile,
    process_cpu,
    process_label,
    status,
    warn_if_busy,
)
from memq.contracts.client import MemoryClient
from memq.contracts.codec import encode, msg_id, subject_for
from memq.contracts.schemas import Event, EventAppended, Message, TextPart
from memq.contracts.subjects import CHANGED_WILDCARD, EVENTS_STREAM
from memq.workers.runtime import bus
from memq.workers.settings import StreamSettings

APP = "bench"
DURABLE = "memq-persistence"
WORKER_CONN_NAME = "memq-persistence"  # bus.connect_options: f"{nats.name}-{worker}"
REPLICAS = (1, 2, 4)
DATABASES = ("postgresql", "sqlite")
# Wide enough for the tables when the output is a file or a pipe (rich's default is 80).
now = time.perf_counter


@dataclass(frozen=True)
class Config:
    events: int  # throughput run
    rate: int  # paced run, events/s
    seconds: float  # paced run length
    serial: int  # raw js.publish awaited one by one
    sessions: int = 50
    users: int = 10  # session i belongs to user i mod users
    paced_sessions: int = 10
    commit_timeout_s: float = 180.0
    backlog: bool = False  # throughput: publish everything with the consumer paused, then time the drain
    call_size: int = 50  # throughput: events per append_many call (and rows per direct-SQL INSERT)


FULL = Config(events=20_000, rate=1_000, seconds=5.0, serial=2_000)
QUICK = Config(events=3_000, rate=500, seconds=2.0, serial=500, commit_timeout_s=60.0)


@dataclass
class Row:
    database: str
    replicas: int
    events: int = 0
    publish_per_s: float = 0.0  # client side, during the throughput run
    commit_per_s: float = 0.0
    ratio_to_raw_async: float = 0.0
    paced_events: int = 0
    paced_rate: float = 0.0  # achieved publish rate of the paced run
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    reordered_notices: int = 0
    expected_rows: int = 0
    stored_rows: int = 0
    stored_distinct: int = 0
    startup_s: float = 0.0
    cpu_ms_per_1k: dict[str, float] = field(default_factory=dict)  # the throughput run, by process

    @property
    def exactly_once(self) -> bool:
        return self.stored_rows == self.stored_distinct == self.expected_rows


# --- machine --------------------------------------------------------------------


# --- workload -----------------------------------------------------------------------


def make_events(n: int, tag: str) -> list[Event]:
    """Alternating user/assistant text turns of ~200 bytes."""
    filler = "the quick brown fox jumps over the lazy dog; " * 4
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        message = Message(role=role, parts=[TextPart(text=f"{tag} turn {i}: {filler}")])
        out.append(Event(author="user" if role == "user" else APP, message=message))
    return out


def session_keys(n: int, tag: str, users: int) -> list[tuple[str, str]]:
    return [(f"u{i % users}", f"{tag}-{i}") for i in range(n)]


def split(events: list[Event], keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[Event]]:
    per = len(events) // len(keys)
    return {k: events[i * per : (i + 1) * per] for i, k in enumerate(keys)}


# --- commit notices -------------------------------------------------------------------


class CommitWatch:
    """Records every ``memq.v1.changed`` notice: per (user, session), the
    arrival time and seq, in arrival order; and, from the replicas'
    ``memq.v1.committed`` notices, when each stream sequence was finished."""

    def __init__(self) -> None:
        self.notices: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
        self.high: dict[tuple[str, str], int] = {}
        self.last_at = 0.0
        self.clock = CommitClock(DURABLE)  # when each stream sequence was finished

    async def start(self, nc) -> None:
        await nc.subscribe(CHANGED_WILDCARD, cb=self._on_notice)
        await self.clock.start(nc)

    async def _on_notice(self, msg) -> None:
        t = now()
        body = orjson.loads(msg.data)
        if "session" not in body:
            return
        key = (body["user"], body["session"])
        self.notices[key].append((t, body["seq"]))
        self.high[key] = max(self.high.get(key, 0), body["seq"])
        self.last_at = t

    def covers(self, targets: dict[tuple[str, str], int]) -> bool:
        return all(self.high.get(k, 0) >= seq for k, seq in targets.items())

    def reordered(self, keys) -> int:
        """Notices below their session's high mark when they arrived."""
        count = 0
        for key in keys:
            high = 0
            for _, seq in self.notices[key]:
                count += seq < high
                high = max(high, seq)
        return count


async def wait_committed(watch: CommitWatch, js, targets: dict, timeout: float) -> float:
    """Wait until every target seq is committed; return the arrival time of the
    last notice (the last commit)."""
    last_seq = max(targets.values())
    deadline = now() + timeout
    while not watch.covers(targets):
        if now() > deadline:
            missing = sum(watch.high.get(k, 0) < s for k, s in targets.items())
            raise TimeoutError(f"{missing} sessions not committed after {timeout:.0f}s")
        await asyncio.sleep(0.005)
    # Notices can run ahead of another replica's older batch; the ack floor cannot.
    while (await js.consumer_info(EVENTS_STREAM, DURABLE)).ack_floor.stream_seq < last_seq:
        if now() > deadline:
            raise TimeoutError(f"ack floor below {last_seq} after {timeout:.0f}s")
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)  # the notice of the very last commit may still be on its way
    return watch.last_at


# --- the measured runs -----------------------------------------------------------------


async def publish_sessions(client: MemoryClient, plan: dict, call_size: int) -> dict[tuple[str, str], int]:
    """Every session at once, each in append_many calls of ``call_size``
    events one after the other; the highest seq of each session."""

    async def one(user: str, session: str, events: list[Event]) -> int:
        seqs = [0]
        for start in range(0, len(events), call_size):
            seqs += await client.append_many(user, session, events[start : start + call_size])
        return max(seqs)

    results = await asyncio.gather(*(one(u, s, evs) for (u, s), evs in plan.items()))
    return dict(zip(plan, results, strict=True))


async def run_throughput(client, watch, js, cfg: Config, row: Row, label) -> None:
    plan = split(make_events(cfg.events, "tp"), session_keys(cfg.sessions, "tp", cfg.users))
    row.events = sum(len(v) for v in plan.values())
    if cfg.backlog:
        await js.pause_consumer(EVENTS_STREAM, DURABLE, "2999-01-01T00:00:00Z")
        # One event waits for the resume: nats-server does not serve the pull
        # requests that waited through a pause until a message arrives (the
        # first commit came ~1.2 s after a bare resume, each replica's pull
        # timeout), and a live stream always has one arriving.
        last_key = next(reversed(plan))
        held = plan[last_key][-1]
        plan[last_key] = plan[last_key][:-1]
    before = process_cpu()
    t0 = now()
    targets = await publish_sessions(client, plan, cfg.call_size)
    published = now()
    row.publish_per_s = row.events / (published - t0)
    if cfg.backlog:
        # The drain alone: its CPU and its time, from the resume on.
        before = process_cpu()
        t0 = now()
        await js.resume_consumer(EVENTS_STREAM, DURABLE)
        targets[last_key] = await client.append(*last_key, held)
    committed = await wait_committed(watch, js, targets, cfg.commit_timeout_s)
    row.cpu_ms_per_1k = per_1k(cpu_between(before, process_cpu(), label), row.events)
    row.commit_per_s = row.events / (committed - t0)


def per_1k(cpu: dict[str, float], events: int) -> dict[str, float]:
    """CPU seconds by process → ms per 1,000 events, and the total."""
    out = {who: round(s * 1e6 / events, 1) for who, s in sorted(cpu.items())}
    return out | {"total": round(sum(cpu.values()) * 1e6 / events, 1)}


async def run_paced(client, watch, js, cfg: Config, row: Row) -> None:
    keys = session_keys(cfg.paced_sessions, "lat", cfg.users)
    n = int(cfg.rate * cfg.seconds)
    events = make_events(n, "lat")
    sent: list[tuple[tuple[str, str], int, float]] = []

    async def one(i: int) -> None:
        key = keys[i % len(keys)]
        t0 = now()
        sent.append((key, await client.append(*key, events[i]), t0))

    tasks = []
    start = now() + 0.01
    for i in range(n):
        delay = start + i / cfg.rate - now()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    last_start = now()
    await asyncio.gather(*tasks)
    targets: dict[tuple[str, str], int] = {}
    for key, seq, _ in sent:
        targets[key] = max(targets.get(key, 0), seq)
    await wait_committed(watch, js, targets, cfg.commit_timeout_s)

    # Exact with any number of replicas: the notice that names the sequence.
    latencies = [(watch.clock.at[seq] - t0) * 1000 for _, seq, t0 in sent]
    row.paced_events = n
    row.paced_rate = n / (last_start - start) if last_start > start else float("nan")
    row.p50_ms = statistics.median(latencies)
    row.p99_ms = percentile(latencies, 99)
    row.reordered_notices = watch.reordered(keys)


# --- one configuration -----------------------------------------------------------------


def connected_workers(nats_server: services.NatsServer) -> int:
    url = f"http://{services.HOST}:{nats_server.monitor_port}/connz?limit=1000"
    with urllib.request.urlopen(url, timeout=2) as r:
        conns = json.load(r).get("connections") or []
    return sum(c.get("name") == WORKER_CONN_NAME for c in conns)


async def wait_for_replicas(js, nats_server, workers: list, timeout: float = 90.0) -> None:
    """Until the durable consumer exists and all N replicas are connected."""
    deadline = now() + timeout
    while True:
        for w in workers:
            if w.proc.poll() is not None:
                raise RuntimeError(f"a worker exited ({w.proc.returncode}):\n{w.log_tail()}")
        try:
            await js.consumer_info(EVENTS_STREAM, DURABLE)
            if await asyncio.to_thread(connected_workers, nats_server) >= len(workers):
                return
        except NotFoundError:
            pass
        if now() > deadline:
            raise TimeoutError(f"{len(workers)} replicas not ready after {timeout:.0f}s")
        await asyncio.sleep(0.05)


def stop_worker(worker, grace_s: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s`` (the results are already checked,
    and a slow shutdown must not stretch the run). True if it stopped by itself."""
    if worker.proc is None or worker.proc.poll() is not None:
        return True
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(grace_s)
        return True
    except subprocess.TimeoutExpired:
        worker.kill()
        return False


async def stop_workers(workers: list) -> None:
    clean = await asyncio.gather(*(asyncio.to_thread(stop_worker, w) for w in workers))
    if not all(clean):
        killed = clean.count(False)
        status(f"  [yellow]{killed} of {len(workers)} workers did not stop within 5 s of SIGTERM: killed[/]")


async def run_configuration(db: str, db_url: str, replicas: int, cfg: Config, work: Path) -> Row:
    row = Row(database=db, replicas=replicas)
    async with AsyncExitStack() as stack:
        nats_server = stack.enter_context(services.NatsServer())
        engine = await helpers.migrated_engine(db_url)  # once, before the replicas race to
        stack.push_async_callback(engine.dispose)
        settings = helpers.make_settings(nats_server.url, db_url, work)
        workers = []
        for i in range(replicas):
            w = helpers.WorkerProcess(settings, work / f"worker{i}.log")
            w.env["MEMQ_DATABASE__MIGRATE_ON_START"] = "false"  # migrated above
            workers.append(w)
        stack.push_async_callback(stop_workers, workers)
        t = now()
        for w in workers:
            w.start()

        nc = await nats.connect(nats_server.url, name="bench-watch")
        stack.push_async_callback(nc.close)
        js = nc.jetstream()
        try:
            await wait_for_replicas(js, nats_server, workers)
            row.startup_s = now() - t
            watch = CommitWatch()
            await watch.start(nc)
            client = await stack.enter_async_context(await MemoryClient.connect(nats_server.url, app=APP))

            status(f"  throughput: {cfg.events:,} events, {cfg.sessions} sessions …")
            label = process_label({w.proc.pid: "persistence" for w in workers if w.proc is not None})
            await run_throughput(client, watch, js, cfg, row, label)
            status(f"    {row.commit_per_s:,.0f} events/s committed (published at {row.publish_per_s:,.0f}/s)")

            status(f"  latency: {cfg.rate:,}/s for {cfg.seconds:g} s, {cfg.paced_sessions} sessions …")
            await run_paced(client, watch, js, cfg, row)
            status(f"    p50 {row.p50_ms:.1f} ms, p99 {row.p99_ms:.1f} ms (achieved {row.paced_rate:,.0f}/s)")
        except BaseException:
            for i, w in enumerate(workers):
                console.print(f"[red]worker {i} log:[/]\n{w.log_tail()}")
            raise

        row.expected_rows = row.events + row.paced_events
        row.stored_rows, row.stored_distinct = await helpers.event_counts(engine)
    return row


# --- baselines -------------------------------------------------------------------------


def raw_payloads(events: list[Event], keys) -> list[tuple[str, bytes, str]]:
    """The exact bytes memq publishes, on subjects of a scratch stream."""
    plan = split(events, keys)
    out = []
    for (user, session), evs in plan.items():
        for e in evs:
            message = EventAppended(app=APP, user=user, session=session, event=e)
            subject = subject_for(message).replace("memq.v1.ev.", "bench.raw.", 1)
            out.append((subject, encode(message), msg_id(message)))
    return out


async def raw_publish_async(js, payloads) -> tuple[float, dict[str, float]]:
    """Messages/s, and the CPU they cost by process (ms per 1,000)."""
    before = process_cpu()
    t0 = now()
    futures = [await js.publish_async(s, d, headers={"Nats-Msg-Id": i}) for s, d, i in payloads]
    await asyncio.gather(*futures)
    rate = len(payloads) / (now() - t0)
    return rate, per_1k(cpu_between(before, process_cpu(), process_label({})), len(payloads))


async def raw_publish_serial(js, payloads) -> float:
    t0 = now()
    for s, d, i in payloads:
        await js.publish(s, d, headers={"Nats-Msg-Id": i})
    return len(payloads) / (now() - t0)


async def client_publish_only(url: str, cfg: Config) -> tuple[float, dict[str, float]]:
    plan = split(make_events(cfg.events, "pub"), session_keys(cfg.sessions, "pub", cfg.users))
    events = sum(len(v) for v in plan.values())
    async with await MemoryClient.connect(url, app=APP) as client:
        before = process_cpu()
        t0 = now()
        await publish_sessions(client, plan, cfg.call_size)
        rate = events / (now() - t0)
        return rate, per_1k(cpu_between(before, process_cpu(), process_label({})), events)


DIRECT_SCHEMA = """
CREATE TABLE direct_turns (
    session_id text NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    role text NOT NULL,
    data jsonb NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (session_id, seq)
)
"""
DIRECT_INSERT = (
    "INSERT INTO direct_turns (session_id, role, data, created_at) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::float8[])"
)


async def direct_sql_bulk(dsn: str, cfg: Config) -> dict:
    """The same events written straight to PostgreSQL, as a chat history
    that writes its own table does (LangChain's ``add_messages``): per
    session, one multi-row ``INSERT`` of ``call_size`` rows per call,
    committed (autocommit), calls one after the other, every session at once
    on a connection of its own. Rows/s from the first call to the last commit."""
    plan = split(make_events(cfg.events, "sql"), session_keys(cfg.sessions, "sql", cfg.users))
    rows = sum(len(v) for v in plan.values())
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(DIRECT_SCHEMA)
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(dsn, min_size=len(plan), max_size=len(plan))
    try:

        async def one(session: str, events: list[Event]) -> None:
            async with pool.acquire() as conn:
                for start in range(0, len(events), cfg.call_size):
                    chunk = events[start : start + cfg.call_size]
                    await conn.execute(
                        DIRECT_INSERT,
                        [session] * len(chunk),
                        [e.message.role for e in chunk],
                        [e.model_dump_json(exclude_none=True) for e in chunk],
                        [e.timestamp for e in chunk],
                    )

        timed = await _timed_writes(rows, [one(session, evs) for (_, session), evs in plan.items()])
        stored = await pool.fetchval("SELECT count(*) FROM direct_turns")
    finally:
        await pool.close()
    if stored != rows:
        raise RuntimeError(f"direct SQL stored {stored} rows of {rows}")
    return {"path": f"direct SQL: asyncpg INSERT of {cfg.call_size} rows per call (PostgreSQL, committed)", **timed}


async def _timed_writes(rows: int, writers: list) -> dict:
    """Run ``writers`` at once: their rows/s from the first call to the last
    commit, and what it cost the machine per 1,000 rows."""
    before = process_cpu()
    t0 = now()
    await asyncio.gather(*writers)
    rate = rows / (now() - t0)
    cpu = per_1k(cpu_between(before, process_cpu(), process_label({})), rows)
    return {"messages": rows, "per_s": rate, "cpu_ms_per_1k": cpu}


async def langchain_chat_history_bulk(dsn: str, cfg: Config) -> dict:
    """The peer the issue measured (43): LangChain's ``PostgresChatMessageHistory``
    (``langchain-postgres``, psycopg 3) writing the same messages straight to
    PostgreSQL, ``aadd_messages`` of ``call_size`` per call (one
    ``executemany`` and a commit), every session at once on a connection of
    its own, as :func:`direct_sql_bulk` runs. Messages/s from the first call
    to the last commit."""
    try:
        import psycopg
        from langchain_core.messages import AIMessage, HumanMessage
        from langchain_postgres import PostgresChatMessageHistory
    except ImportError as exc:
        raise SystemExit(
            f"--peers needs langchain-postgres ({exc}): .venv/bin/pip install langchain-postgres==0.0.19"
        ) from None
    table = "langchain_history"
    plan = split(make_events(cfg.events, "lc"), session_keys(cfg.sessions, "lc", cfg.users))
    rows = sum(len(v) for v in plan.values())
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await PostgresChatMessageHistory.acreate_tables(conn, table)
    # Connections opened before the clock starts (as direct_sql_bulk's pool
    # is), so that their backends' CPU is counted: a backend gone by the end is not.
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in plan]

    async def one(conn, events: list[Event]) -> None:
        history = PostgresChatMessageHistory(table, str(uuid.uuid4()), async_connection=conn)
        messages = [
            (HumanMessage if e.message.role == "user" else AIMessage)(content=e.message.parts[0].text) for e in events
        ]
        for start in range(0, len(messages), cfg.call_size):
            await history.aadd_messages(messages[start : start + cfg.call_size])

    try:
        timed = await _timed_writes(rows, [one(conn, evs) for conn, evs in zip(conns, plan.values(), strict=True)])
        stored = (await (await conns[0].execute(f"SELECT count(*) FROM {table}")).fetchone())[0]
    finally:
        for conn in conns:
            await conn.close()
    if stored != rows:
        raise RuntimeError(f"LangChain's chat history stored {stored} messages of {rows}")
    path = f"LangChain PostgresChatMessageHistory.aadd_messages, {cfg.call_size} per call (PostgreSQL, committed)"
    return {"path": path, **timed}


async def run_baselines(cfg: Config) -> list[dict]:
    keys = session_keys(cfg.sessions, "raw", cfg.users)
    async_payloads = raw_payloads(make_events(cfg.events, "raw"), keys)
    serial_payloads = raw_payloads(make_events(cfg.serial, "serial"), keys)
    with services.NatsServer() as server:
        nc = await nats.connect(server.url, name="bench-raw")
        try:
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(name="BENCH_RAW", subjects=["bench.raw.>"], storage=StorageType.FILE, duplicate_window=120)
            )
            await bus.ensure_streams(js, StreamSettings())
            status(f"  raw js.publish_async: {len(async_payloads):,} messages …")
            raw_async, raw_cpu = await raw_publish_async(js, async_payloads)
            status(f"  raw js.publish one by one: {len(serial_payloads):,} messages …")
            raw_serial = await raw_publish_serial(js, serial_payloads)
        finally:
            await nc.close()
        status(f"  MemoryClient.append_many, no workers: {cfg.events:,} events …")
        client, client_cpu = await client_publish_only(server.url, cfg)
    return [
        {
            "path": "raw nats-py js.publish_async (pipelined)",
            "messages": len(async_payloads),
            "per_s": raw_async,
            "cpu_ms_per_1k": raw_cpu,
        },
        {"path": "raw nats-py js.publish (awaited one by one)", "messages": len(serial_payloads), "per_s": raw_serial},
        {
            "path": "MemoryClient.append_many (publish only)",
            "messages": cfg.events,
            "per_s": client,
            "cpu_ms_per_1k": client_cpu,
        },
    ]


# --- output ----------------------------------------------------------------------------


def print_results(machine: dict, cfg: Config, quick: bool, baselines: list[dict], rows: list[Row]) -> None:
    raw_async = baselines[0]["per_s"]
    console.print()
    console.print(
        f"[bold]memq ingest benchmark[/] ({'quick' if quick else 'full'}) — "
        f"{machine['date']}, memq {machine['git']}\n"
        f"{machine['nproc']} cores, {machine['cpu']}, Python {machine['python']}, {machine['nats_server']}, "
        f"PostgreSQL {machine.get('postgres', '?')}, SQLite {machine['sqlite']}, "
        f"CPU {machine['cpu_busy_at_start']:.0%} busy before the run"
    )
    table = Table(title="publish → commit (memq worker persistence processes)")
    cols = ("database", "replicas", "events", "commit ev/s", "÷ raw async", "publish ev/s")
    for col in (*cols, "p50 ms", "p99 ms", "reordered"):
        table.add_column(col, justify="left" if col == "database" else "right")
    table.add_column("stored exactly once")
    for r in rows:
        stored = (
            f"[green]✓ {r.stored_rows:,}[/]"
            if r.exactly_once
            else f"[red]✗ {r.stored_rows:,} rows, {r.stored_distinct:,} distinct, {r.expected_rows:,} published[/]"
        )
        table.add_row(
            r.database,
            str(r.replicas),
            f"{r.events:,}",
            f"{r.commit_per_s:,.0f}",
            f"{r.commit_per_s / raw_async:.2f}",
            f"{r.publish_per_s:,.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            str(r.reordered_notices),
            stored,
        )
    console.print(table)
    timed = "consumer resumed after a paused publish (--backlog)" if cfg.backlog else "first publish"
    console.print(
        f"commit ev/s: {cfg.events:,} events over {cfg.sessions} sessions of {cfg.users} users, "
        f"{timed} → last commit notice. "
        f"p50/p99: publish → the committed notice naming the event's sequence, at {cfg.rate:,} events/s for "
        f"{cfg.seconds:g} s over {cfg.paced_sessions} sessions, one append each; reordered = commit notices that "
        "arrived below their session's high mark (another replica committed a newer batch first).",
        highlight=False,
    )
    base = Table(title="baselines (same payloads, one nats-server)")
    for col in ("path", "messages", "msg/s", "÷ raw async"):
        base.add_column(col, justify="left" if col == "path" else "right")
    for b in baselines:
        base.add_row(b["path"], f"{b['messages']:,}", f"{b['per_s']:,.0f}", f"{b['per_s'] / raw_async:.2f}")
    console.print(base)
    direct = next((b for b in baselines if b["path"].startswith("direct SQL")), None)
    peer = next((b for b in baselines if b["path"].startswith("LangChain")), None)
    for r in rows:
        if direct is not None and r.database == "PostgreSQL":
            console.print(
                f"PostgreSQL, {r.replicas} replica(s): memq committed {r.commit_per_s:,.0f} events/s, "
                f"direct SQL {direct['per_s']:,.0f} rows/s, both {cfg.call_size} per call: "
                f"[bold]{r.commit_per_s / direct['per_s']:.2f}×[/] (target ≥ 1)",
                highlight=False,
            )
        if peer is not None and r.database == "PostgreSQL":
            console.print(
                f"PostgreSQL, {r.replicas} replica(s): memq committed {r.commit_per_s:,.0f} events/s, "
                f"LangChain's chat history {peer['per_s']:,.0f} messages/s, both {cfg.call_size} per call: "
                f"[bold]{r.commit_per_s / peer['per_s']:.2f}×[/]",
                highlight=False,
            )
    print_cpu(baselines, rows)


def print_cpu(baselines: list[dict], rows: list[Row]) -> None:
    """What 1,000 events cost the machine, by process: on a machine with few
    cores, events/s is bounded by cores ÷ CPU per event."""
    runs = [(b["path"], b["cpu_ms_per_1k"]) for b in baselines if "cpu_ms_per_1k" in b]
    runs += [(f"{r.database}, {r.replicas} replica{'s' if r.replicas > 1 else ''}", r.cpu_ms_per_1k) for r in rows]
    who = sorted({k for _, cpu in runs for k in cpu if k != "total"}, key=lambda k: (k == "other", k))
    table = Table("run", *who, "total", title="CPU per 1,000 events, ms (all processes of the machine)")
    for name, cpu in runs:
        table.add_row(name, *(f"{cpu.get(k, 0):,.0f}" for k in who), f"{cpu.get('total', 0):,.0f}")
    console.print(table)


def worker_settings() -> dict:
    """The persistence settings the worker processes run with."""
    settings = helpers.make_settings("nats://127.0.0.1:4222", "sqlite+aiosqlite:///unused.db", Path("."))
    return settings.persistence.model_dump(mode="json")


def write_json(
    path: Path, machine: dict, cfg: Config, quick: bool, replicas: list[int], baselines: list[dict], rows: list[Row]
) -> None:
    raw_async = baselines[0]["per_s"]
    data = {
        "benchmark": "ingest",
        "mode": "quick" if quick else "full",
        "machine": machine,
        "config": {**asdict(cfg), "replicas": replicas, "worker": worker_settings()},
        "baselines": [{**b, "ratio_to_raw_async": b["per_s"] / raw_async} for b in baselines],
        "rows": [{**asdict(r), "exactly_once": r.exactly_once} for r in rows],
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    status(f"results written to {path}")


# --- main --------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> int:
    quick, json_path, replicas = args.quick, args.json, args.replicas
    cfg = replace(
        QUICK if quick else FULL,
        backlog=args.backlog,
        **{
            k: v
            for k, v in (
                ("events", args.events),
                ("sessions", args.sessions),
                ("users", args.users),
                ("call_size", args.call_size),
            )
            if v
        },
    )
    machine = machine_info()
    started = now()
    status(f"[bold]memq ingest benchmark[/] — {'quick' if quick else 'full'} run")
    warn_if_busy(machine)
    status("baselines (no workers) …")
    baselines = await run_baselines(cfg)

    rows: list[Row] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp:
        status("starting PostgreSQL …")
        pg = stack.enter_context(services.Postgres())
        machine["postgres"] = pg.psql("SHOW server_version").strip()
        if "postgresql" in args.databases:
            status(f"  direct SQL bulk insert, {cfg.call_size} rows per call: {cfg.events:,} rows …")
            pg.create_database("bench_direct")
            baselines.append(await direct_sql_bulk(pg.dsn("bench_direct"), cfg))
            if args.peers:
                status(f"  LangChain's Postgres chat history, {cfg.call_size} per call: {cfg.events:,} messages …")
                pg.create_database("bench_langchain")
                baselines.append(await langchain_chat_history_bulk(pg.dsn("bench_langchain"), cfg))
        names = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}
        configs = [(names[db], n) for db in args.databases for n in replicas]
        for i, (db, n) in enumerate(configs, 1):
            work = Path(tmp) / f"{db.lower()}-{n}"
            work.mkdir()
            if db == "PostgreSQL":
                url = pg.create_database(f"bench_{n}_{uuid.uuid4().hex[:8]}")
            else:
                url = f"sqlite+aiosqlite:///{work / 'memq.db'}"
            status(f"[bold][{i}/{len(configs)}] {db}, {n} replica{'s' if n > 1 else ''}[/]")
            rows.append(await run_configuration(db, url, n, cfg, work))
            rows[-1].ratio_to_raw_async = rows[-1].commit_per_s / baselines[0]["per_s"]

    print_results(machine, cfg, quick, baselines, rows)
    machine["wall_s"] = round(now() - started, 1)
    status(f"total {machine['wall_s']:.0f} s")
    if json_path:
        write_json(json_path, machine, cfg, quick, replicas, baselines, rows)
    return 0 if all(r.exactly_once for r in rows) else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute or two)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument(
        "--replicas", type=_counts, default=list(REPLICAS), metavar="N,N,…", help="persistence replica counts (1,2,4)"
    )
    parser.add_argument("--events", type=_count, metavar="N", help="events of the throughput run (20,000; quick 3,000)")
    parser.add_argument("--sessions", type=_count, metavar="N", help="sessions of the throughput run (50)")
    parser.add_argument("--users", type=_count, metavar="N", help="users the sessions belong to (10)")
    parser.add_argument(
        "--call-size",
        type=_count,
        metavar="N",
        help="events per append_many call of the throughput run, and rows per direct-SQL INSERT (50)",
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="throughput: publish with the consumer paused, then time the workers' drain alone",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also LangChain's PostgresChatMessageHistory writing the same messages (needs langchain-postgres)",
    )
    parser.add_argument(
        "--databases",
        type=lambda v: _names(v, DATABASES),
        default=list(DATABASES),
        metavar="NAME,…",
        help="postgresql, sqlite or both (both)",
    )
    args = parser.parse_args()
    events = args.events or (QUICK if args.quick else FULL).events
    if events < (args.sessions or Config.sessions):
        parser.error("--events must be at least --sessions (every session gets events)")
    return args


def _count(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return n


def _counts(value: str) -> list[int]:
    return [_count(v) for v in value.split(",")]


def _names(value: str, allowed: tuple[str, ...]) -> list[str]:
    names = [v.strip().lower() for v in value.split(",")]
    if unknown := [n for n in names if n not in allowed]:
        raise argparse.ArgumentTypeError(f"unknown: {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return names


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
