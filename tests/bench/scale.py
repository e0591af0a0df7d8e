"""Scale-out benchmark: N replicas of every worker on a 3-node NATS cluster.

Usage::

    .venv/bin/python tests/run_bench.py scale [--quick | --smoke] [--json PATH]

Everything runs on loopback, on servers this script starts and stops itself
(``tests/services.py``): a 3-node NATS JetStream cluster (streams R3,
``MEMQ_STREAMS__REPLICAS=3``), PostgreSQL, Redis and Weaviate. The workers
are real ``memq worker <kind>`` processes (persistence, indexing, summarizer,
query), configured as in production: PostgreSQL, the Weaviate index with the
local ONNX embedder, the Redis cache, the extractive summarizer with
``summary_buffer`` (budget 1,000 tokens) for the benchmark's app, so
sessions get checkpoints as they grow.

**Scale-out.** The fleet grows 1 → 2 → 4 replicas of *every* kind (new
processes join the running ones, as a deployment scales out). At each N:

1. *ingest*: E events (realistic turns, ~20–60 tokens) over S new sessions,
   published with ``MemoryClient.append_many`` as fast as they go. Events/s
   from the first publish until the persistence consumer's ack floor passes
   the last one (every event committed to PostgreSQL).
2. *indexing*: the burst's backlog, from resuming the indexing replicas until
   the indexing consumer's ack floor passes the burst: docs/s embedded and
   written to Weaviate (the docs are counted exactly afterwards, checkpoints
   included). Embedding is CPU-bound and by far the slowest path.
3. *queries*: C concurrent requesters, each sending
   its next request when the last is answered, for T s of ``history`` then T
   s of ``context`` (with recall: the query worker embeds the last user
   message and searches Weaviate). Every request is a cache miss (a distinct
   budget), so each takes the full path (Redis, SQL, strategy, recall).
   Requests/s, p50 and p99. Meanwhile paced appends (R/s, one
   ``client.append`` each, to other sessions) give the publish → commit
   latency (p50/p99) under that load, from the ``memq.v1.changed`` notices.

The indexing replicas are paused (SIGSTOP; they keep their connections and
unacked messages) during the ingest and query steps and resumed for their
own: on a machine this small their embedding backlog would otherwise take
the cores the measured kind needs, where a deployment gives each kind its
own. Between steps the run waits until both consumers have acked the whole
stream and the summarizers are quiet.

Per process and kind: peak RSS (``VmHWM``) and CPU (``utime + stime`` from
``/proc``) during each step, in cores per replica: the figures Kubernetes
resource requests are set from.

**Fault.** At N = 4, under paced appends and queries: SIGKILL the NATS node
that leads ``MEMQ_EVENTS`` and one replica of each kind, keep the load going,
stop it, wait until every consumer has acked everything, then check the
whole run (every phase): every acked event is in the stream once, at the seq
its PubAck returned, and in SQL exactly once; the index holds one doc per
indexable message and nothing else; no checkpoint was published twice and no
session's range was summarized twice; nothing was dead-lettered. A failed
check makes the exit code 1. Nothing is paused in this phase.

Sizes (full / ``--quick``): E = 3,000 / 300 events over S = 50 / 15
sessions; C = 32 requesters for T = 5 / 2 s per op; R = 50 / 20 appends/s;
the fault phase 30 / 9 s at 50 / 30 appends/s with 8 query requesters.
Every event is also embedded, at ~50 docs/s on two idle cores: that and
starting 16 worker processes make ``--quick`` take about two minutes.
``--smoke`` (the test command's run) is one replica of each kind on one
NATS node (R1), 60 events, no fault phase: every step and every check
still runs, in about a minute.

This form starts every process without limits: it is the many-core form,
for a machine with a core per replica. ``quota_scale.py`` shows scale-out
on few cores, each replica under a fixed CPU quota.

Ratios are side by side in the same run: each N against N = 1. This machine
has few cores (see the header): 4N worker processes, three nats-servers,
PostgreSQL, Weaviate, Redis and the load generator share them, so the
numbers show how far one machine's cores go, not how a deployment with a
node per replica scales.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import helpers
import nats
import orjson
import services
from nats.js.api import DeliverPolicy
from rich.table import Table
from sqlalchemy import select

from bench import fleet as fleetlib
from bench.benchlib import CommitClock, console, machine_info, percentile, status, warn_if_busy
from bench.query import make_events
from bench.scale_checks import Check, Snapshot, check_all
from memq.contracts.client import MemoryClient, build_request, encode_request
from memq.contracts.codec import decode_from_subject
from memq.contracts.errors import PublishFailed
from memq.contracts.schemas import Event
from memq.contracts.subjects import EVENTS_STREAM, EVENTS_WILDCARD, request_subject
from memq.workers.index.backends import open_backend
from memq.workers.memory.recall import doc_for
from memq.workers.runtime import bus
from memq.workers.settings import Settings, StreamSettings
from memq.workers.sql import models

APP = "bench"
USERS = 10
KINDS = fleetlib.KINDS
DURABLES = {"persistence": "memq-persistence", "indexing": "memq-indexing"}
QUERY_BUDGET = 4000  # + a counter: every query a new cache key
now = time.perf_counter


@dataclass(frozen=True)
class Config:
    events: int  # ingest burst per N
    sessions: int  # sessions of the burst
    concurrency: int  # query requesters
    query_s: float  # each query window (history, then context)
    warmup_s: float  # unmeasured queries before the windows (new replicas load their embedder)
    paced_rate: float  # appends/s during the query windows
    paced_sessions: int
    fault_s: float  # load during the fault phase; the kill comes after a third of it
    fault_rate: float  # appends/s during the fault phase
    fault_sessions: int
    fault_concurrency: int  # query requesters during the fault phase
    drain_timeout_s: float = 240.0
    replicas: tuple[int, ...] = (1, 2, 4)  # the fleet's sizes, in order
    nodes: int = 3  # NATS cluster nodes = stream replicas
    fault: bool = True  # the fault phase (needs a cluster: it kills the stream's leader)
    app_budget: int = 1000  # summary_buffer budget of the benchmark's app: sessions get checkpoints


FULL = Config(
    events=3000,
    sessions=50,
    concurrency=32,
    query_s=5.0,
    warmup_s=1.0,
    paced_rate=50,
    paced_sessions=10,
    fault_s=30.0,
    fault_rate=50,
    fault_sessions=20,
    fault_concurrency=8,
)
# Every event published must also be embedded (~50 docs/s on 2 idle cores):
# the quick run keeps the event counts small.
QUICK = Config(
    events=300,
    sessions=15,
    concurrency=32,
    query_s=2.0,
    warmup_s=0.5,
    paced_rate=20,
    paced_sessions=10,
    fault_s=9.0,
    fault_rate=30,
    fault_sessions=10,
    fault_concurrency=8,
)
# The smoke test's run (--smoke): one replica of each kind on one NATS node,
# no fault phase; every step and the exactly-once checks still run.
SMOKE = Config(
    events=60,
    sessions=3,
    concurrency=4,
    query_s=1.0,
    warmup_s=0.3,
    paced_rate=10,
    paced_sessions=3,
    fault_s=0.0,
    fault_rate=0,
    fault_sessions=0,
    fault_concurrency=0,
    drain_timeout_s=120.0,
    replicas=(1,),
    nodes=1,
    fault=False,
    app_budget=300,  # 20 turns a session pass it: the summarizer's checks have checkpoints to check
)
MODES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}

# Settings every replica runs with beyond the defaults, and why.
WORKER_ENV = {
    "MEMQ_DATABASE__MIGRATE_ON_START": "false",  # migrated once, before the replicas race to
    "MEMQ_CACHE__BACKEND": "redis",
    "MEMQ_INDEXING__BACKEND": "weaviate",  # the embedded index is one SQLite file: one machine only
    # A killed replica's unacked batch is redelivered after ack_wait: shorter
    # than the defaults (30 s, 120 s) so the fault phase drains in seconds;
    # still far above a batch's processing time here.
    "MEMQ_PERSISTENCE__ACK_WAIT_S": "5",
    "MEMQ_INDEXING__ACK_WAIT_S": "15",
    # A killed summarizer's sessions are free again after the lease TTL.
    "MEMQ_SUMMARIZER__LEASE_TTL_S": "10",
    "MEMQ_SUMMARIZER__SWEEP_INTERVAL_S": "5",
}


# --- results ---------------------------------------------------------------------------


@dataclass
class Load:
    """One closed-loop query run."""

    op: str
    concurrency: int
    seconds: float = 0.0
    requests: int = 0
    errors: int = 0
    first_error: str = ""
    per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    with_memories: int = 0  # context replies with recalled memories (a recall slower than 2 s is skipped)


@dataclass
class Step:
    """CPU and memory while one step ran."""

    wall_s: float
    kinds: dict[str, dict] = field(default_factory=dict)  # kind -> replicas, cpu_s, cores_per_replica, peak_rss_mib
    servers_cpu_s: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0  # share of all cores busy
    others: float = 0.0  # share of all cores used by processes outside this benchmark


@dataclass
class Phase:
    replicas: int
    startup_s: float = 0.0
    events: int = 0
    first_seq: int = 0
    last_seq: int = 0
    publish_per_s: float = 0.0
    ingest_per_s: float = 0.0
    indexing_s: float = 0.0
    indexing_docs: int = 0  # counted from the stream afterwards
    indexing_per_s: float = 0.0
    paced_events: int = 0
    paced_p50_ms: float = float("nan")
    paced_p99_ms: float = float("nan")
    queries: list[Load] = field(default_factory=list)
    steps: dict[str, Step] = field(default_factory=dict)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)  # kind -> max over its replicas
    settle_s: float = 0.0


@dataclass
class Fault:
    killed_node: str = ""
    leaders_before: dict[str, str] = field(default_factory=dict)  # stream -> node
    leaders_after: dict[str, str] = field(default_factory=dict)
    killed_workers: list[str] = field(default_factory=list)
    kill_at_s: float = 0.0
    appends: int = 0
    appends_retried: int = 0  # appends that needed more than one publish
    publish_attempts_failed: int = 0
    appends_never_acked: int = 0
    longest_append_s: float = 0.0  # first attempt → PubAck
    longest_ack_gap_s: float = 0.0  # the longest time without any PubAck, during the load
    queries_before: int = 0  # answered before the kill
    errors_before: int = 0
    queries_after: int = 0
    errors_after: int = 0
    longest_answer_gap_s: float = 0.0  # the longest time without any answered query
    query_first_error: str = ""
    drain_s: float = 0.0
    load_s: float = 0.0


# --- the machine and its processes ------------------------------------------------------


class Meter:
    """CPU of every replica, server and the whole machine over one step."""

    def __init__(self, fleet: fleetlib.Fleet, servers: dict[str, int]):
        self.fleet, self.servers = fleet, servers

    def start(self) -> None:
        self.t0 = now()
        self.w0 = self.fleet.usage()
        self.s0 = {name: fleetlib.tree_cpu_s(pid) for name, pid in self.servers.items()}
        self.m0 = fleetlib.machine_ticks()
        self.me0 = time.process_time()

    def stop(self) -> Step:
        wall = now() - self.t0
        w1 = self.fleet.usage()
        s1 = {name: fleetlib.tree_cpu_s(pid) for name, pid in self.servers.items()}
        busy1, total1 = fleetlib.machine_ticks()
        me = time.process_time() - self.me0
        step = Step(wall_s=round(wall, 3))
        step.servers_cpu_s["load generator"] = round(me, 3)
        ours = me
        for kind in KINDS:
            deltas, peaks, detail = [], [], {}
            for r in self.fleet.replicas[kind]:
                before, after = self.w0.get(r.name), w1.get(r.name) or (r.last if r.killed else None)
                if before is None or after is None:
                    continue
                deltas.append(after.cpu_s - before.cpu_s)
                peaks.append(after.peak_rss_mib)
                detail[r.name] = {"cpu_s": round(deltas[-1], 3), "peak_rss_mib": round(peaks[-1], 1)}
            ours += sum(deltas)
            step.kinds[kind] = {
                "replicas": len(deltas),
                "cpu_s": round(sum(deltas), 3),
                "cores_per_replica": round(sum(deltas) / len(deltas) / wall, 3) if deltas and wall > 0 else 0.0,
                "peak_rss_mib": round(max(peaks), 1) if peaks else 0.0,
                "per_replica": detail,
            }
        for name in self.servers:
            step.servers_cpu_s[name] = round(s1[name] - self.s0[name], 3)
            ours += s1[name] - self.s0[name]
        busy0, total0 = self.m0
        cores = max(total1 - total0, 1) / (fleetlib.TICK * wall) if wall > 0 else 1
        step.machine_busy = round((busy1 - busy0) / max(total1 - total0, 1), 3)
        step.others = round(max(0.0, step.machine_busy - ours / (wall * cores)), 3) if wall > 0 else 0.0
        return step


# --- NATS helpers -------------------------------------------------------------------------


async def floor(js, durable: str) -> int:
    info = await js.consumer_info(EVENTS_STREAM, durable)
    return info.ack_floor.stream_seq if info.ack_floor else 0


async def wait_floor(js, durable: str, seq: int, timeout: float, fleet: fleetlib.Fleet) -> float:
    """Until ``durable``'s ack floor reaches ``seq``; the moment it did. A
    failing consumer_info (a node or a leader just lost) is retried."""
    deadline = now() + timeout
    last = 0
    while True:
        try:
            last = await floor(js, durable)
            if last >= seq:
                return now()
        except (TimeoutError, nats.errors.Error):
            pass
        if now() > deadline:
            raise TimeoutError(f"{durable}: ack floor {last} below {seq} after {timeout:.0f}s")
        fleet.check_alive()
        await asyncio.sleep(0.01)


async def last_seq(js) -> int:
    return (await js.stream_info(EVENTS_STREAM)).state.last_seq


async def settle(js, fleet: fleetlib.Fleet, timeout: float, quiet_s: float = 1.5) -> int:
    """Until both consumers have acked the whole stream and nothing new has
    arrived for ``quiet_s`` (the summarizers' checkpoints come after the
    commits that trigger them). The stream's last seq then."""
    deadline = now() + timeout
    while True:
        target = await last_seq(js)
        for durable in DURABLES.values():
            await wait_floor(js, durable, target, max(1.0, deadline - now()), fleet)
        await asyncio.sleep(quiet_s)
        if await last_seq(js) == target:
            return target
        if now() > deadline:
            raise TimeoutError(f"the stream kept growing for {timeout:.0f}s")


async def wait_ready(js, cluster, fleet: fleetlib.Fleet, n: int, timeout: float = 120.0) -> None:
    """Until N replicas of each kind are connected and the pull consumers
    have N waiting fetches (each idle replica keeps one open)."""
    deadline = now() + timeout
    while True:
        fleet.check_alive()
        counts = await asyncio.to_thread(fleetlib.connections, cluster)
        if all(counts.get(fleetlib.CONNECTION_NAMES[k], 0) >= n for k in KINDS):
            waiting = {}
            for durable in DURABLES.values():
                try:
                    waiting[durable] = (await js.consumer_info(EVENTS_STREAM, durable)).num_waiting or 0
                except nats.js.errors.NotFoundError:
                    waiting[durable] = 0
            if all(w >= n for w in waiting.values()):
                return
        if now() > deadline:
            raise TimeoutError(f"{n} replicas of each kind not ready after {timeout:.0f}s: {dict(counts)}")
        await asyncio.sleep(0.1)


async def leaders(js) -> dict[str, str]:
    """The node leading each stream memq uses (the lease bucket included)."""
    out = {}
    for stream in (EVENTS_STREAM, "MEMQ_DLQ", "KV_MEMQ_LEASES"):
        try:
            info = await asyncio.wait_for(js.stream_info(stream), 3)
            leader = info.cluster.leader if info.cluster and info.cluster.leader else "none"
            out[stream] = f"{leader} (R{info.config.num_replicas})"
        except nats.js.errors.NotFoundError:
            out[stream] = "-"
        except (TimeoutError, nats.errors.Error) as exc:  # no leader, or its only replica is down
            out[stream] = f"unavailable ({type(exc).__name__})"
    return out


# --- workload -----------------------------------------------------------------------------


def burst_plan(cfg: Config, tag: str, seed: int) -> dict[tuple[str, str], list[Event]]:
    per = cfg.events // cfg.sessions
    return {
        (f"u{i % USERS}", f"{tag}-{i}"): make_events(per, f"{tag}-{i}", seed=seed * 1000 + i)
        for i in range(cfg.sessions)
    }


class Bodies:
    """Request bodies as MemoryClient builds them, each a new cache key."""

    def __init__(self, sessions: list[tuple[str, str]]):
        self.sessions = sessions
        self.counter = 0
        self.rng = random.Random(7)

    def next(self, op: str) -> bytes:
        self.counter += 1
        user, session = self.rng.choice(self.sessions)
        fields = dict(
            user=user, session=session, strategy={"kind": "summary_buffer", "budget": QUERY_BUDGET + self.counter}
        )
        if op == "context":
            fields.update(format="memq", recall_limit=5)
        return encode_request(build_request(APP, op, **fields))


async def run_queries(
    nc, op: str, bodies: Bodies, concurrency: int, seconds: float, timeout: float = 10.0, log: list | None = None
) -> Load:
    """``log`` (if given) gets (time, answered) per request."""
    load = Load(op=op, concurrency=concurrency)
    latencies: list[float] = []
    subject = request_subject(APP, op)
    stop_at = now() + seconds

    async def requester() -> None:
        while now() < stop_at:
            body = bodies.next(op)
            t0 = now()
            try:
                msg = await nc.request(subject, body, timeout=timeout)
            except Exception as exc:  # timeouts, no responders while a node is down
                load.errors += 1
                load.first_error = load.first_error or f"{type(exc).__name__}: {exc}"
                if log is not None:
                    log.append((now(), False))
                await asyncio.sleep(0.05)
                continue
            ok = msg.data.startswith(b'{"ok":true')
            if log is not None:
                log.append((now(), ok))
            if not ok:
                load.errors += 1
                load.first_error = load.first_error or msg.data[:300].decode(errors="replace")
                continue
            latencies.append(now() - t0)
            if op == "context" and orjson.loads(msg.data)["result"]["tokens"]["recalled"] > 0:
                load.with_memories += 1

    t0 = now()
    await asyncio.gather(*(requester() for _ in range(concurrency)))
    load.seconds = now() - t0
    load.requests = len(latencies)
    load.per_s = len(latencies) / load.seconds
    if latencies:
        ms = [x * 1000 for x in latencies]
        load.p50_ms, load.p99_ms = statistics.median(ms), percentile(ms, 99)
    return load


class Appender:
    """Paced appends, one ``client.append`` each, retried with the same
    event (so the same Nats-Msg-Id) until acked: a publish that fails while
    a node is down never becomes a second copy."""

    def __init__(self, client: MemoryClient, sessions: list[tuple[str, str]], tag: str, acked: dict[str, int]):
        self.client, self.sessions, self.acked = client, sessions, acked
        self.events = make_events(4000, tag, seed=11)
        self.sent: list[tuple[tuple[str, str], int, float, float]] = []  # key, seq, t0, acked at
        self.failed_attempts = 0
        self.retried = 0
        self.unacked = 0
        self.n = 0

    async def one(self, key: tuple[str, str], event: Event, give_up_at: float) -> None:
        t0 = now()
        failed = 0
        while True:
            try:
                seq = await self.client.append(*key, event)
                break
            except PublishFailed:
                failed += 1
                self.failed_attempts += 1
                if now() > give_up_at:
                    self.unacked += 1
                    return
                await asyncio.sleep(0.2)
        self.retried += failed > 0
        self.acked[event.id] = seq
        self.sent.append((key, seq, t0, now()))

    async def run(self, rate: float, until: asyncio.Event) -> None:
        tasks = []
        start = now()
        while not until.is_set():
            delay = start + self.n / rate - now()
            if delay > 0:
                try:
                    await asyncio.wait_for(until.wait(), delay)
                    break
                except TimeoutError:
                    pass
            event = self.events[self.n % len(self.events)].model_copy(update={"id": str(uuid.uuid4())})
            key = self.sessions[self.n % len(self.sessions)]
            tasks.append(asyncio.create_task(self.one(key, event, now() + 60)))
            self.n += 1
        await asyncio.gather(*tasks)


def commit_latencies(clock: CommitClock, sent) -> list[float]:
    """Publish → commit of each paced append, from the ``committed`` notice
    that names its seq (exact with any number of replicas; a seq no notice
    named yet is left out, which cannot happen once the ack floor passed it)."""
    return [(clock.at[seq] - t0) * 1000 for _, seq, t0, _ in sent if seq in clock.at]


# --- one N ----------------------------------------------------------------------------------


async def run_phase(n: int, cfg: Config, env: Env) -> Phase:
    """One N: ingest, indexing and query steps, each measured while the
    other kinds are idle (the indexing replicas paused outside their step)."""
    phase = Phase(replicas=n)
    js, fleet, meter = env.js, env.fleet, env.meter
    t = now()
    fleet.scale_to(n)
    await wait_ready(js, env.cluster, fleet, n)
    phase.startup_s = now() - t
    status(f"  {n} replica(s) of each kind ready in {phase.startup_s:.1f} s")

    # ingest (indexing paused)
    plan = burst_plan(cfg, f"n{n}", seed=n)
    phase.events = sum(len(v) for v in plan.values())
    fleet.pause("indexing")
    meter.start()
    t0 = now()
    results = await asyncio.gather(*(env.client.append_many(u, s, evs) for (u, s), evs in plan.items()))
    published = now()
    for evs, seqs in zip(plan.values(), results):
        env.acked.update((e.id, seq) for e, seq in zip(evs, seqs))
    phase.first_seq = min(min(s) for s in results)
    phase.last_seq = max(max(s) for s in results)
    committed = await wait_floor(js, DURABLES["persistence"], phase.last_seq, cfg.drain_timeout_s, fleet)
    phase.steps["ingest"] = meter.stop()
    phase.publish_per_s = phase.events / (published - t0)
    phase.ingest_per_s = phase.events / (committed - t0)
    status(f"  ingest: {phase.events:,} events, {phase.ingest_per_s:,.0f}/s committed")

    # indexing: the burst's backlog, from resume to the ack floor
    meter.start()
    t0 = now()
    fleet.resume("indexing")
    indexed = await wait_floor(js, DURABLES["indexing"], phase.last_seq, cfg.drain_timeout_s, fleet)
    phase.steps["indexing"] = meter.stop()
    phase.indexing_s = indexed - t0
    status(f"  indexing: the burst indexed in {phase.indexing_s:.1f} s")
    t = now()
    await settle(js, fleet, cfg.drain_timeout_s)  # the summaries the burst triggered, and their docs
    phase.settle_s = now() - t

    # queries and paced appends (indexing paused)
    fleet.pause("indexing")
    bodies = Bodies(list(plan))
    await run_queries(env.nc, "context", bodies, cfg.concurrency, cfg.warmup_s)  # new replicas load their embedder
    paced_keys = [(f"u{i % USERS}", f"n{n}-paced-{i}") for i in range(cfg.paced_sessions)]
    appender = Appender(env.client, paced_keys, f"n{n}-paced", env.acked)
    stop = asyncio.Event()
    pacing = asyncio.create_task(appender.run(cfg.paced_rate, stop))
    meter.start()
    for op in ("history", "context"):
        phase.queries.append(await run_queries(env.nc, op, bodies, cfg.concurrency, cfg.query_s))
        q = phase.queries[-1]
        status(f"  {op}: {q.per_s:,.0f} req/s, p50 {q.p50_ms:.1f} ms, p99 {q.p99_ms:.1f} ms ({q.errors} errors)")
    stop.set()
    await pacing
    phase.steps["queries"] = meter.stop()
    if appender.sent:
        last = max(seq for _, seq, _, _ in appender.sent)
        await wait_floor(js, DURABLES["persistence"], last, cfg.drain_timeout_s, fleet)
        await asyncio.sleep(0.1)  # the last commit notice may still be on its way
        ms = commit_latencies(env.clock, appender.sent)
        phase.paced_events = len(appender.sent)
        phase.paced_p50_ms, phase.paced_p99_ms = statistics.median(ms), percentile(ms, 99)
        status(f"  commit latency: p50 {phase.paced_p50_ms:.1f} ms, p99 {phase.paced_p99_ms:.1f} ms")
    for kind in KINDS:
        peaks = [u.peak_rss_mib for r in fleet.replicas[kind] if (u := r.sample() or r.last) is not None]
        phase.peak_rss_mib[kind] = round(max(peaks), 1) if peaks else 0.0
    fleet.resume("indexing")
    t = now()
    await settle(js, fleet, cfg.drain_timeout_s)  # index the paced events before the next N
    phase.settle_s += now() - t
    status(f"  settled (indexing and summaries caught up) in {phase.settle_s:.1f} s")
    return phase


# --- the fault ----------------------------------------------------------------------------------


async def run_fault(cfg: Config, env: Env) -> Fault:
    fault = Fault()
    js, fleet = env.js, env.fleet
    keys = [(f"u{i % USERS}", f"fault-{i}") for i in range(cfg.fault_sessions)]
    # Seed the sessions so queries have something to read.
    seeds = [make_events(10, f"fault-{i}", seed=i) for i in range(len(keys))]
    seeded = await asyncio.gather(*(env.client.append_many(*k, evs) for k, evs in zip(keys, seeds)))
    for evs, seqs in zip(seeds, seeded):
        env.acked.update((e.id, seq) for e, seq in zip(evs, seqs))
    await wait_floor(js, DURABLES["persistence"], max(max(s) for s in seeded), cfg.drain_timeout_s, fleet)
    appender = Appender(env.client, keys, "fault", env.acked)
    bodies = Bodies(keys)
    stop = asyncio.Event()
    t0 = now()
    pacing = asyncio.create_task(appender.run(cfg.fault_rate, stop))

    answers: list[tuple[float, bool]] = []

    async def queries() -> list[Load]:
        out = []
        while not stop.is_set():
            for op in ("history", "context"):
                out.append(await run_queries(env.nc, op, bodies, cfg.fault_concurrency, 1.0, timeout=5.0, log=answers))
        return out

    querying = asyncio.create_task(queries())
    await asyncio.sleep(cfg.fault_s / 3)
    fault.leaders_before = await leaders(js)
    victim_name = fault.leaders_before[EVENTS_STREAM].split()[0]
    victim = next(node for node in env.cluster.nodes if node.server_name == victim_name)
    fault.kill_at_s = now() - t0
    killed_at = now()
    victim.kill()
    for kind in KINDS:
        fault.killed_workers.append(fleet.kill_one(kind).name)
    fault.killed_node = victim_name
    status(
        f"  killed nats {victim_name} (leader of {EVENTS_STREAM}) and {', '.join(fault.killed_workers)} "
        f"at {fault.kill_at_s:.1f} s"
    )
    await asyncio.sleep(cfg.fault_s - (now() - t0))
    stop.set()
    await pacing
    loads = await querying
    fault.load_s = now() - t0
    end = now()
    fault.appends = len(appender.sent)
    fault.appends_retried = appender.retried
    fault.publish_attempts_failed = appender.failed_attempts
    fault.appends_never_acked = appender.unacked
    fault.longest_append_s = max((acked - t for _, _, t, acked in appender.sent), default=0.0)
    fault.longest_ack_gap_s = longest_gap([acked for *_, acked in appender.sent], t0, end)
    fault.queries_before = sum(ok for t, ok in answers if t < killed_at)
    fault.errors_before = sum(not ok for t, ok in answers if t < killed_at)
    fault.queries_after = sum(ok for t, ok in answers if t >= killed_at)
    fault.errors_after = sum(not ok for t, ok in answers if t >= killed_at)
    fault.longest_answer_gap_s = longest_gap([t for t, ok in answers if ok], t0, end)
    fault.query_first_error = next((q.first_error for q in loads if q.first_error), "")
    t = now()
    await settle(js, fleet, cfg.drain_timeout_s, quiet_s=3.0)
    fault.drain_s = now() - t
    fault.leaders_after = await leaders(js)
    return fault


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval in [start, end] without any of ``times``."""
    points = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(points, points[1:]))


async def snapshot(env: Env, upto: int) -> tuple[Snapshot, list[int]]:
    """Read the stream, SQL and the index, all cut at ``upto``; also the seq
    of every indexable message (to count each phase's docs)."""
    stream_events, stream_checkpoints, expected_docs, doc_seqs = [], [], set(), []
    sub = await env.js.subscribe(
        EVENTS_WILDCARD, stream=EVENTS_STREAM, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        seq = 0
        while seq < upto:
            msg = await sub.next_msg(timeout=10)
            seq = msg.metadata.sequence.stream
            if seq > upto:
                break
            message = decode_from_subject(msg.subject, msg.data)
            if message.kind == "event":
                stream_events.append((message.event.id, seq))
            elif message.kind == "checkpoint":
                stream_checkpoints.append(message.id)
            if (doc := doc_for(seq, message, "all")) is not None:
                expected_docs.add(doc.uuid)
                doc_seqs.append(seq)
    finally:
        await sub.unsubscribe()

    events, checkpoints = models.Event.__table__, models.Checkpoint.__table__
    async with env.engine.connect() as conn:
        sql_events = [
            tuple(r)
            for r in (await conn.execute(select(events.c.event_id, events.c.seq).where(events.c.seq <= upto))).all()
        ]
        sql_checkpoints = [
            tuple(r)
            for r in (
                await conn.execute(
                    select(
                        checkpoints.c.session_key,
                        checkpoints.c.checkpoint_id,
                        checkpoints.c.seq,
                        checkpoints.c.up_to_seq,
                    ).where(checkpoints.c.seq <= upto)
                )
            ).all()
        ]
    index = open_backend(env.settings)
    await index.open()
    try:
        index_docs = [doc.uuid async for doc in index.export() if doc.seq <= upto]
        index_count = await index.count()
    finally:
        await index.close()
    dlq = (await env.js.stream_info("MEMQ_DLQ")).state.messages
    floors = {d: await floor(env.js, d) for d in DURABLES.values()}
    snap = Snapshot(
        upto=upto,
        acked=dict(env.acked),
        stream_events=stream_events,
        sql_events=sql_events,
        expected_docs=expected_docs,
        index_docs=index_docs,
        index_count=index_count,
        stream_checkpoints=stream_checkpoints,
        sql_checkpoints=sql_checkpoints,
        dead_letters=dlq,
        floors=floors,
    )
    return snap, doc_seqs


# --- the whole run ----------------------------------------------------------------------------


@dataclass
class Env:
    cluster: services.NatsCluster
    settings: object
    fleet: fleetlib.Fleet
    meter: Meter
    nc: object
    js: object
    client: MemoryClient
    clock: CommitClock
    engine: object
    acked: dict[str, int] = field(default_factory=dict)


def start_services(stack: AsyncExitStack, nodes: int):
    """All servers at once (launch, then wait): startup is the slow part."""
    cluster = services.NatsCluster(size=nodes)
    pg, redis, weaviate = services.Postgres(), services.Redis(), services.Weaviate()
    servers = [*cluster.nodes, weaviate, redis, pg]
    for s in servers:
        stack.callback(s.close)
    for s in servers:
        s.launch()
    for s in servers:
        s.wait_ready()
    return cluster, pg, redis, weaviate


async def main(mode: str, json_path: Path | None) -> int:
    cfg = MODES[mode]
    # SIGTERM cleans up like Ctrl-C: the worker processes and servers are stopped.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    machine = machine_info()
    started = now()
    status(f"[bold]memq scale-out benchmark[/] — {mode} run, {machine['nproc']} cores")
    warn_if_busy(machine)
    phases: list[Phase] = []
    fault: Fault | None = None
    checks: list[Check] = []
    async with AsyncExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memq-scale-")))
        status(f"starting a {cfg.nodes}-node NATS cluster, PostgreSQL, Redis and Weaviate …")
        t = now()
        cluster, pg, redis, weaviate = start_services(stack, cfg.nodes)
        status(f"  ready in {now() - t:.1f} s")
        machine["postgres"] = pg.psql("SHOW server_version").strip()
        db_url = pg.create_database("scale")
        engine = await helpers.migrated_engine(db_url)
        stack.push_async_callback(engine.dispose)
        weaviate_settings = {"url": weaviate.url, "grpc_port": weaviate.grpc_port, "collection": "MemqScale"}
        settings = Settings(
            data_dir=work,
            nats={"url": cluster.url},
            database={"url": db_url},
            streams={"replicas": cfg.nodes},
            persistence={"retry_delays_s": [0.2, 0.5, 1.0]},
            cache={"redis_url": redis.url},
            indexing={"backend": "weaviate", "weaviate": weaviate_settings},
        )
        env_vars = dict(WORKER_ENV)
        env_vars.update(
            MEMQ_STREAMS__REPLICAS=str(cfg.nodes),  # R3 streams on the 3-node cluster
            MEMQ_QUERY__APPS=json.dumps({APP: {"strategy": "summary_buffer", "budget": cfg.app_budget}}),
            MEMQ_CACHE__REDIS_URL=redis.url,
            MEMQ_INDEXING__WEAVIATE__URL=weaviate.url,
            MEMQ_INDEXING__WEAVIATE__GRPC_PORT=str(weaviate.grpc_port),
            MEMQ_INDEXING__WEAVIATE__COLLECTION="MemqScale",
        )
        fleet = fleetlib.Fleet(settings, env_vars, work)
        stack.callback(stop_fleet, fleet)

        servers = {f"nats-{node.server_name}": node.pid for node in cluster.nodes}
        servers.update(postgres=pg.pid, weaviate=weaviate.pid, redis=redis.pid)
        nats_opts = dict(
            servers=cluster.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=ignore_error
        )
        nc = await nats.connect(name="bench-scale", **nats_opts)
        stack.push_async_callback(nc.close)
        js = nc.jetstream(timeout=5)
        await bus.ensure_streams(js, StreamSettings(replicas=cfg.nodes))  # R3 before any worker races to create them
        client = await MemoryClient.connect(app=APP, timeout=2.0, **nats_opts)
        stack.push_async_callback(client.close)
        clock = CommitClock()
        await clock.start(nc)
        env = Env(cluster, settings, fleet, Meter(fleet, servers), nc, js, client, clock, engine)

        try:
            steps = len(cfg.replicas) + cfg.fault
            for i, n in enumerate(cfg.replicas, 1):
                status(f"[bold][{i}/{steps}] {n} replica{'s' if n > 1 else ''} of each worker[/]")
                phases.append(await run_phase(n, cfg, env))
            if cfg.fault:
                status(
                    f"[bold][{steps}/{steps}] fault: {cfg.replicas[-1]} replicas, "
                    f"kill a NATS node and one replica of each kind mid-load[/]"
                )
                fault = await run_fault(cfg, env)
            upto = await last_seq(js)
            status(f"  checking the whole run (stream up to seq {upto:,}) …")
            snap, doc_seqs = await snapshot(env, upto)
            checks = check_all(snap)
        except BaseException:
            for r in fleet.all():
                if not r.killed and not r.alive:
                    console.print(f"[red]{r.name} exited:[/]\n{r.log_tail()}")
            raise
        count_indexed(phases, doc_seqs)

    machine["wall_s"] = round(now() - started, 1)
    print_results(machine, cfg, mode, phases, fault, checks)
    status(f"total {machine['wall_s']:.0f} s")
    if json_path:
        write_json(json_path, machine, cfg, mode, phases, fault, checks)
    return 0 if checks and all(c.ok for c in checks) else 1


async def ignore_error(exc: Exception) -> None:
    """The bench's connections see a node die in the fault phase; they reconnect."""


def stop_fleet(fleet: fleetlib.Fleet) -> None:
    killed = fleet.stop()
    for name in killed:
        replica = next(r for r in fleet.all() if r.name == name)
        status(
            f"[yellow]{name} did not stop within 5 s of SIGTERM: killed. The end of its log:[/]\n{replica.log_tail(10)}"
        )


def count_indexed(phases: list[Phase], doc_seqs: list[int]) -> None:
    """Docs each phase's indexing step covered (its seq range: its events and
    the checkpoints in between), counted from the stream read for the checks."""
    for p in phases:
        p.indexing_docs = sum(p.first_seq <= seq <= p.last_seq for seq in doc_seqs)
        p.indexing_per_s = p.indexing_docs / p.indexing_s if p.indexing_s else 0.0


# --- output -------------------------------------------------------------------------------------


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "–"


def print_results(
    machine: dict, cfg: Config, mode: str, phases: list[Phase], fault: Fault | None, checks: list[Check]
) -> None:
    console.print()
    n = cfg.replicas[-1]
    console.print(
        f"[bold]memq scale-out benchmark[/] ({mode}) — {machine['date']}, memq {machine['git']}\n"
        f"{machine['nproc']} cores, {machine['cpu']}, Python {machine['python']}, {machine['nats_server']} "
        f"({cfg.nodes}-node cluster, R{cfg.nodes}), PostgreSQL {machine.get('postgres', '?')}, "
        f"CPU {machine['cpu_busy_at_start']:.0%} busy before the run\n"
        f"[yellow]{machine['nproc']} cores for everything: at N = {n}, {4 * n} worker processes, {cfg.nodes} "
        f"nats-server(s), PostgreSQL, Weaviate, Redis and the load generator share them.[/]",
        highlight=False,
    )
    base = phases[0] if phases else None
    t = Table(title="scale-out: throughput (× = against N = 1, same run)")
    for col in (
        "N",
        "ingest ev/s",
        "×",
        "indexing docs/s",
        "×",
        "history req/s",
        "×",
        "context req/s",
        "×",
        "others' CPU",
    ):
        t.add_column(col, justify="right")
    for p in phases:
        h, c = p.queries[0], p.queries[1]
        t.add_row(
            str(p.replicas),
            f"{p.ingest_per_s:,.0f}",
            ratio(p.ingest_per_s, base.ingest_per_s),
            f"{p.indexing_per_s:,.1f}",
            ratio(p.indexing_per_s, base.indexing_per_s),
            f"{h.per_s:,.0f}",
            ratio(h.per_s, base.queries[0].per_s),
            f"{c.per_s:,.0f}",
            ratio(c.per_s, base.queries[1].per_s),
            f"{max(s.others for s in p.steps.values()):.0%}",
        )
    console.print(t)
    t = Table(title="scale-out: latency")
    for col in (
        "N",
        "commit p50 ms",
        "commit p99 ms",
        "history p50 ms",
        "history p99 ms",
        "context p50 ms",
        "context p99 ms",
        "with memories",
        "query errors",
        "startup s",
    ):
        t.add_column(col, justify="right")
    for p in phases:
        h, c = p.queries[0], p.queries[1]
        t.add_row(
            str(p.replicas),
            f"{p.paced_p50_ms:.1f}",
            f"{p.paced_p99_ms:.1f}",
            f"{h.p50_ms:.1f}",
            f"{h.p99_ms:.1f}",
            f"{c.p50_ms:.1f}",
            f"{c.p99_ms:.1f}",
            f"{c.with_memories / max(c.requests, 1):.0%}",
            str(h.errors + c.errors),
            f"{p.startup_s:.1f}",
        )
    console.print(t)
    console.print(
        f"ingest: {cfg.events:,} events over {cfg.sessions} new sessions per N, first publish → persistence ack floor. "
        f"indexing: the burst's backlog, from resuming the indexing replicas to their ack floor (docs counted from "
        f"the stream, checkpoints included). "
        f"queries: {cfg.concurrency} concurrent requesters, {cfg.query_s:g} s each, every request a cache miss; "
        f"commit p50/p99: {cfg.paced_rate:g} appends/s meanwhile, publish → commit notice. The indexing replicas "
        f"are paused (SIGSTOP) during the ingest and query steps: their embedding backlog would otherwise take "
        f"the cores the measured kind needs (in a deployment each kind has its own). "
        f"with memories: context replies that include recalled memories (a recall slower than "
        f"MEMQ_RECALL__TIMEOUT_S, 2 s, is skipped). "
        f"others' CPU: the largest share of the machine used by processes outside this benchmark during a step.",
        highlight=False,
    )
    t = Table(title="resources per worker process (CPU in cores per replica during each step)")
    for col in ("N", "kind", "replicas", "peak RSS MiB", "ingest", "indexing", "queries"):
        t.add_column(col, justify="left" if col == "kind" else "right")
    for p in phases:
        for kind in KINDS:
            cells = [f"{p.steps[s].kinds[kind]['cores_per_replica']:.2f}" for s in ("ingest", "indexing", "queries")]
            t.add_row(str(p.replicas), kind, str(p.replicas), f"{p.peak_rss_mib[kind]:.0f}", *cells)
    console.print(t)
    if fault is not None:
        console.print(
            f"fault: {fault.load_s:.0f} s of {cfg.fault_rate:g} appends/s and {cfg.fault_concurrency} query requesters; at "
            f"{fault.kill_at_s:.1f} s SIGKILL of nats {fault.killed_node} (leader of {EVENTS_STREAM}; leaders before "
            f"{fault.leaders_before}, after {fault.leaders_after}) and of {', '.join(fault.killed_workers)}. "
            f"appends: {fault.appends:,} acked, {fault.appends_retried} of them after failed publishes "
            f"({fault.publish_attempts_failed} failed attempts, {fault.appends_never_acked} never acked); longest "
            f"append {fault.longest_append_s:.2f} s, longest time without a PubAck {fault.longest_ack_gap_s:.2f} s. "
            f"queries: {fault.queries_before:,} answered and {fault.errors_before} failed before the kill, "
            f"{fault.queries_after:,} answered and {fault.errors_after} failed after"
            f"{' (' + fault.query_first_error[:100] + ')' if fault.query_first_error else ''}; longest time without "
            f"an answer {fault.longest_answer_gap_s:.2f} s. Every consumer had acked everything "
            f"{fault.drain_s:.1f} s after the load stopped.",
            highlight=False,
        )
    t = Table(title="exactly once, over the whole run (after the fault)")
    for col in ("check", "expected", "found", ""):
        t.add_column(col)
    for c in checks:
        t.add_row(c.name, c.expected, c.found, "[green]✓[/]" if c.ok else "[red]✗[/]")
    console.print(t)


def write_json(path: Path, machine: dict, cfg: Config, mode: str, phases, fault, checks) -> None:
    data = {
        "benchmark": "scale",
        "mode": mode,
        "machine": machine,
        "config": {**asdict(cfg), "worker_env": WORKER_ENV},
        "phases": [asdict(p) for p in phases],
        "fault": asdict(fault) if fault else None,
        "checks": [asdict(c) for c in checks],
        "passed": bool(checks) and all(c.ok for c in checks),
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    status(f"results written to {path}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_const",
        const="quick",
        dest="mode",
        help="a short run (~2 minutes: worker start-up and embedding are the slow parts)",
    )
    size.add_argument(
        "--smoke",
        action="store_const",
        const="smoke",
        dest="mode",
        help="the smoke test's run: one replica of each kind, one NATS node, no fault phase (~1 minute)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.set_defaults(mode="full")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    try:
        sys.exit(asyncio.run(main(args.mode, args.json)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        status("[yellow]interrupted: every worker and server this run started is stopped[/]")
        sys.exit(130)
