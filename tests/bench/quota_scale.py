"""Scale-out under CPU quotas: 1, 2 and 4 replicas of each kind, each held to a fixed share of a core.

Usage::

    .venv/bin/python tests/run_bench.py quota_scale [--quick | --smoke] [--quota 0.25] [--replicas 1 2 4] [--json PATH]

Two cores cannot show scale-out with unlimited processes: one replica takes
what it can and a second only splits it (``scale.py``). A deployment gives
each replica a CPU limit instead (``--cpus``, a Kubernetes limit), and under
one the question is answerable here: does a second replica at the same
quota add a replica's worth of throughput, and where does it stop? Each
``memq worker`` process gets a cgroup of its own held to ``--quota`` cores
(``cpuquota.py``: cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``, made
and removed by this script, no containers); the servers (nats-server,
PostgreSQL, Redis) and this load generator get the rest, unlimited.

On loopback, on servers this script starts: one nats-server, PostgreSQL,
Redis; the embedded index (SQLite, one file every replica opens) with the
local ONNX embedder at ``ceil(quota)`` threads a replica. Indexing runs
with ``storage_scope = conversational``, so the ingest steps' events (tool
results, of their own app, purged from the stream once stored) take no
embedding, in batches of 8 (a backlog of D docs keeps at most D / batch
replicas busy: 64 would idle most of 4 on 160 docs). The fleet grows 1 → 2 → 4 replicas of
persistence, indexing and query (the replicas start unlimited and are
confined once ready: start-up is not measured), and at each N it measures
one kind at a time, the others idle:

1. *ingest* (persistence): E tool-result events over S sessions published
   while the persistence consumer is paused; events/s from its resume until
   its ack floor passes the last one (all in PostgreSQL).
2. *indexing*: D user and assistant turns published with the indexing
   consumer paused; docs/s from its resume to its ack floor.
3. *rebuild* (indexing): ``memq index rebuild --app bench-rebuild
   --no-pull`` of R docs (published at the start), the N replicas doing
   the work; docs/s from the start to the switch.
4. *history*, *context* (query): C concurrent requesters for T s each, every
   request a cache miss (``context`` embeds the last user turn and searches
   the index).

Beside each figure: each replica's CPU (cores, against its quota), the share
of its CFS periods the kernel throttled (it wanted more than its quota),
and the servers' CPU; the verdict line under the table says, for each
step, whether 4 replicas reached 3.2× one and, if not, what was short: the
replicas (throttled: quota-bound, at a higher cost per unit), the machine
(the servers' share), or neither (a lock or the stream: replicas idle
under their quota while cores were free).

Sizes (full / ``--quick`` / ``--smoke``): E = 20,000 / 4,000 / 1,000; D and R
= 160 / 48 / 16; C = 16 / 16 / 4, T = 8 / 3 / 1 s. ``--smoke`` is the test
command's run, at N = 1 and 2. ``--quota 0`` runs without limits: the
many-core form, for a machine with a core per replica (with ``--replicas
1 2 4 8``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import helpers
import nats
import services
from rich.table import Table

from bench import cpuquota
from bench import fleet as fleetlib
from bench.benchlib import console, machine_info, status, warn_if_busy
from bench.query import make_events
from bench.scale import APP, Bodies, run_queries, wait_floor
from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, EventAppended, Message, TextPart
from memq.contracts.subjects import EVENTS_STREAM, EVENTS_WILDCARD, encode_token
from memq.workers.index.backends import open_backend
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.indexer import Indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.memory.recall import doc_for
from memq.workers.runtime import bus
from memq.workers.settings import LocalEmbedderSettings, Settings

KINDS = ("persistence", "indexing", "query")
DURABLES = {"persistence": "memq-persistence", "indexing": "memq-indexing"}
REBUILD_APP = "bench-rebuild"
INGEST_APP = "bench-ingest"  # its events are purged from the stream after each ingest step
# A backlog of D docs feeds at most D / batch replicas at once: the default
# (64) would leave most of 4 replicas idle on 160 docs, a size no deployment's
# backlog has. 8 splits 160 docs into 20 batches, 5 a replica at N = 4.
INDEX_BATCH = 8
SCOPE = "conversational"
USERS = 10
FOREVER = "2999-01-01T00:00:00Z"  # a consumer paused until resumed
TARGET = 3.2  # 4 replicas against one (issue 39)
now = time.perf_counter


@dataclass(frozen=True)
class Config:
    events: int  # ingest backlog per N
    sessions: int
    docs: int  # indexing backlog per N
    rebuild_docs: int  # the rebuilt app's docs
    concurrency: int  # query requesters
    query_s: float  # each query window
    warmup_s: float
    replicas: tuple[int, ...] = (1, 2, 4)
    drain_timeout_s: float = 300.0


MODES = {
    "full": Config(events=20_000, sessions=40, docs=160, rebuild_docs=160, concurrency=16, query_s=8.0, warmup_s=2.0),
    "quick": Config(events=4_000, sessions=20, docs=48, rebuild_docs=48, concurrency=16, query_s=3.0, warmup_s=1.0),
    "smoke": Config(
        events=1_000, sessions=5, docs=16, rebuild_docs=16, concurrency=4, query_s=1.0, warmup_s=0.5, replicas=(1, 2)
    ),
}


@dataclass
class Step:
    """One kind's throughput at one N, and what its processes used meanwhile."""

    op: str
    kind: str
    replicas: int
    units: int = 0  # events, docs or answered requests
    seconds: float = 0.0
    per_s: float = 0.0
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    replica_cores: list[float] = field(default_factory=list)  # each replica of the kind
    window_s: float = 0.0  # the wall time the cores are measured over
    throttled: list[float] = field(default_factory=list)  # share of each one's CFS periods throttled
    servers_cores: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0  # share of all cores busy
    others: float = 0.0  # share of all cores used by processes outside this benchmark


# --- measuring ------------------------------------------------------------------------------


class Meter:
    """CPU of one kind's replicas, their throttling, the servers and the machine over one step."""

    def __init__(self, fleet: fleetlib.Fleet, servers: dict[str, int], quotas: cpuquota.Quotas | None):
        self.fleet, self.servers, self.quotas = fleet, servers, quotas

    def start(self) -> None:
        self.t0 = now()
        self.w0 = self.fleet.usage()
        self.q0 = self._throttling()
        self.s0 = {name: fleetlib.tree_cpu_s(pid) for name, pid in self.servers.items()}
        self.m0 = fleetlib.machine_ticks()
        self.me0 = time.process_time()

    def _throttling(self) -> dict[str, cpuquota.Throttling]:
        if self.quotas is None:
            return {}
        return {name: self.quotas.throttling(name) for name in self.quotas.children}

    def stop(self, step: Step) -> Step:
        wall = now() - self.t0
        step.window_s = round(wall, 3)
        step.per_s = round(step.units / step.seconds, 1) if step.seconds else 0.0
        w1, q1 = self.fleet.usage(), self._throttling()
        busy1, total1 = fleetlib.machine_ticks()
        ours = time.process_time() - self.me0
        step.servers_cores["bench"] = round(ours / wall, 3)
        for name, pid in self.servers.items():
            spent = fleetlib.tree_cpu_s(pid) - self.s0[name]
            step.servers_cores[name] = round(spent / wall, 3)
            ours += spent
        for r in self.fleet.all():
            if r.name in self.w0 and r.name in w1:
                spent = w1[r.name].cpu_s - self.w0[r.name].cpu_s
                ours += spent
                if r.kind == step.kind:
                    step.replica_cores.append(round(spent / wall, 3))
                    if r.name in q1 and r.name in self.q0:
                        d = q1[r.name].since(self.q0[r.name])
                        step.throttled.append(round(d.throttled / d.periods, 3) if d.periods else 0.0)
        busy0, total0 = self.m0
        cores = len(os.sched_getaffinity(0))
        step.machine_busy = round((busy1 - busy0) / max(total1 - total0, 1), 3)
        step.others = round(max(0.0, step.machine_busy - ours / (wall * cores)), 3)
        return step


# --- workload -------------------------------------------------------------------------------


def tool_events(n: int, tag: str) -> list[Event]:
    """Tool results of ~40 tokens: stored by persistence, no doc under SCOPE."""
    return [
        Event(
            author="get_weather",
            message=Message(role="tool", parts=[TextPart(text=f"{tag} result {i}: light rain, 14-19 °C, wind " * 3)]),
        )
        for i in range(n)
    ]


def plan_of(events: list[Event], sessions: int, tag: str) -> dict[tuple[str, str], list[Event]]:
    keys = [(f"u{i % USERS}", f"{tag}-{i}") for i in range(sessions)]
    return {k: events[i::sessions] for i, k in enumerate(keys)}


def docs_in(plan: dict[tuple[str, str], list[Event]], app: str = APP) -> int:
    """The docs the indexing worker makes of the plan's events under SCOPE."""
    return sum(
        doc_for(0, EventAppended(app=app, user=u, session=s, event=e), SCOPE) is not None
        for (u, s), evs in plan.items()
        for e in evs
    )


async def publish_held(client: MemoryClient, plan: dict) -> tuple[tuple[str, str], Event, int]:
    """Publish every event but the last session's last; that one (its key and
    itself) is for after the resume, and the highest seq so far."""
    key = next(reversed(plan))
    held = plan[key][-1]
    plan = {**plan, key: plan[key][:-1]}
    results = await asyncio.gather(*(client.append_many(u, s, evs) for (u, s), evs in plan.items() if evs))
    return key, held, max(max(r) for r in results if r)


async def drain(env: Env, durable: str, client: MemoryClient, key, held: Event) -> tuple[float, int]:
    """Resume ``durable`` and time it through the backlog. nats-server does not
    serve pull requests that waited through a pause until a message arrives:
    the held event is that message (ingest.py --backlog does the same)."""
    t0 = now()
    await env.js.resume_consumer(EVENTS_STREAM, durable)
    last = await client.append(*key, held)
    done = await wait_floor(env.js, durable, last, env.cfg.drain_timeout_s, env.fleet)
    return done - t0, last


async def settle(env: Env) -> None:
    """Both consumers resumed and through the whole stream."""
    for durable in DURABLES.values():
        await env.js.resume_consumer(EVENTS_STREAM, durable)
    last = (await env.js.stream_info(EVENTS_STREAM)).state.last_seq
    for durable in DURABLES.values():
        await wait_floor(env.js, durable, last, env.cfg.drain_timeout_s, env.fleet)


async def wait_pulling(env: Env, n: int, timeout: float = 120.0) -> None:
    """Until each pull consumer has a waiting request from each of n replicas."""
    deadline = now() + timeout
    for durable in DURABLES.values():
        while (await env.js.consumer_info(EVENTS_STREAM, durable)).num_waiting < n:
            if now() > deadline:
                raise TimeoutError(f"{durable}: fewer than {n} replicas pulling after {timeout:.0f}s")
            env.fleet.check_alive()
            await asyncio.sleep(0.1)


# --- the steps --------------------------------------------------------------------------------


async def ingest(env: Env, n: int) -> Step:
    cfg = env.cfg
    plan = plan_of(tool_events(cfg.events, f"in{n}"), cfg.sessions, f"ingest-n{n}")
    for durable in DURABLES.values():  # indexing too: its skipping would take the servers' cores
        await env.js.pause_consumer(EVENTS_STREAM, durable, FOREVER)
    key, held, _ = await publish_held(env.ingest_client, plan)
    env.meter.start()
    seconds, _ = await drain(env, DURABLES["persistence"], env.ingest_client, key, held)
    step = env.meter.stop(Step("ingest", "persistence", n, units=cfg.events, seconds=seconds))
    await settle(env)  # the indexing replicas pass over the tool results, unmeasured
    # Stored in SQL and passed by both consumers: out of the stream, so that
    # the rebuilds (a replay from seq 1) do not skip more of them at each N.
    await env.js.purge_stream(EVENTS_STREAM, subject=f"{EVENTS_WILDCARD[:-1]}{encode_token(INGEST_APP, 'app')}.>")
    return step


async def indexing(env: Env, n: int) -> Step:
    cfg = env.cfg
    plan = plan_of(make_events(cfg.docs, f"ix{n}", seed=n), max(1, cfg.docs // 16), f"index-n{n}")
    env.sessions = list(plan)
    await env.js.pause_consumer(EVENTS_STREAM, DURABLES["indexing"], FOREVER)
    key, held, last = await publish_held(env.client, plan)
    await wait_floor(env.js, DURABLES["persistence"], last, cfg.drain_timeout_s, env.fleet)
    env.meter.start()
    seconds, _ = await drain(env, DURABLES["indexing"], env.client, key, held)
    return env.meter.stop(Step("indexing", "indexing", n, units=docs_in(plan), seconds=seconds))


async def rebuild_step(env: Env, n: int) -> Step:
    embedder = LocalEmbedder(LocalEmbedderSettings())  # its model name only: the replicas embed
    backend = open_backend(env.settings)
    await backend.open()
    try:
        indexer = Indexer(backend, embedder, max_message_bytes=env.settings.streams.max_message_bytes)
        env.meter.start()
        t0 = now()
        result = await rebuild(env.settings, env.nc, indexer, app=REBUILD_APP, work=False)
        step = env.meter.stop(Step("rebuild", "indexing", n, units=result.docs, seconds=now() - t0))
    finally:
        await backend.close()
        await embedder.close()
    if result.docs != env.rebuild_docs:
        raise RuntimeError(f"the rebuild embedded {result.docs} docs, not the {env.rebuild_docs} of {REBUILD_APP}")
    return step


async def queries(env: Env, n: int) -> list[Step]:
    cfg = env.cfg
    bodies = Bodies(env.sessions)
    await run_queries(env.nc, "context", bodies, cfg.concurrency, cfg.warmup_s)  # new replicas warm up
    steps = []
    for op in ("history", "context"):
        env.meter.start()
        load = await run_queries(env.nc, op, bodies, cfg.concurrency, cfg.query_s)
        step = Step(op, "query", n, units=load.requests, seconds=load.seconds, errors=load.errors)
        step.p50_ms, step.p99_ms = round(load.p50_ms, 1), round(load.p99_ms, 1)
        steps.append(env.meter.stop(step))
    return steps


# --- the whole run -----------------------------------------------------------------------------


@dataclass
class Env:
    cfg: Config
    quota: float
    settings: Settings
    fleet: fleetlib.Fleet
    quotas: cpuquota.Quotas | None
    meter: Meter
    nc: object
    js: object
    client: MemoryClient
    ingest_client: MemoryClient
    rebuild_docs: int = 0
    sessions: list[tuple[str, str]] = field(default_factory=list)


async def grow(env: Env, n: int, first: bool) -> float:
    """Start replicas up to n of each kind, wait until they pull, then confine
    the new ones; the seconds it took."""
    t0 = now()
    new = env.fleet.scale_to(n)
    for r in new:
        await asyncio.to_thread(r.wait_ready, 240)
    await wait_pulling(env, n)
    if first:
        await settle(env)  # the rebuild's app, indexed live once, unlimited
    if env.quotas is not None:
        for r in new:
            env.quotas.confine(r.name, r.pid, env.quota)
    return now() - t0


def worker_env(settings: Settings, quota: float) -> dict[str, str]:
    return {
        "MEMQ_INDEXING__BACKEND": "embedded",
        "MEMQ_INDEXING__STORAGE_SCOPE": SCOPE,
        "MEMQ_INDEXING__BATCH_SIZE": str(INDEX_BATCH),
        "MEMQ_INDEXING__LOCAL__THREADS": str(max(1, math.ceil(quota)) if quota else 0),
        "MEMQ_CACHE__BACKEND": "redis",
        "MEMQ_DATABASE__MIGRATE_ON_START": "false",
        "MEMQ_LOG_LEVEL": "WARNING",
    }


async def main(args: argparse.Namespace) -> int:
    cfg = MODES[args.mode]
    if args.replicas:
        cfg = Config(**{**asdict(cfg), "replicas": tuple(args.replicas)})
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    machine = machine_info()
    machine["load_average"] = list(os.getloadavg())
    started = now()
    status(
        f"[bold]memq scale-out under CPU quotas[/] — {args.mode} run, {machine['nproc']} cores, "
        f"{args.quota or 'no'} core quota per replica, load average {machine['load_average'][0]:.1f}"
    )
    warn_if_busy(machine)
    steps: list[Step] = []
    startup: dict[int, float] = {}
    async with AsyncExitStack() as stack:
        quotas = None
        if args.quota:
            try:
                quotas = cpuquota.Quotas(f"memq-quota-scale-{os.getpid()}")
            except cpuquota.Unavailable as exc:
                status(f"[red]CPU quotas are not available here: {exc}. Run with --quota 0 (no limits).[/]")
                return 2
            stack.callback(lambda: [status(f"[yellow]left behind: {p}[/]") for p in quotas.close()])
            machine["cgroup"] = quotas.version
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memq-quota-scale-")))
        status("starting nats-server, PostgreSQL and Redis …")
        nats_server, pg, redis = services.NatsServer(), services.Postgres(), services.Redis()
        for s in (nats_server, pg, redis):
            stack.callback(s.close)
            s.launch()
        for s in (nats_server, pg, redis):
            s.wait_ready()
        machine["postgres"] = pg.psql("SHOW server_version").strip()
        db_url = pg.create_database("quota_scale")
        engine = await helpers.migrated_engine(db_url)
        await engine.dispose()
        settings = Settings(
            data_dir=work,
            nats={"url": nats_server.url},
            database={"url": db_url},
            cache={"redis_url": redis.url},
            indexing={"backend": "embedded", "storage_scope": SCOPE, "batch_size": INDEX_BATCH},
        )
        fleet = fleetlib.Fleet(
            settings, {**worker_env(settings, args.quota), "MEMQ_CACHE__REDIS_URL": redis.url}, work, kinds=KINDS
        )
        stack.callback(fleet.stop)
        servers = {"nats": nats_server.pid, "postgres": pg.pid, "redis": redis.pid}
        nc = await nats.connect(nats_server.url)
        stack.push_async_callback(nc.close)
        await bus.ensure_streams(nc.jetstream(), settings.streams)  # the corpus goes in before any worker
        client = await MemoryClient.connect(nats_server.url, app=APP, timeout=5.0)
        stack.push_async_callback(client.close)
        rebuild_client = await MemoryClient.connect(nats_server.url, app=REBUILD_APP, timeout=5.0)
        stack.push_async_callback(rebuild_client.close)
        ingest_client = await MemoryClient.connect(nats_server.url, app=INGEST_APP, timeout=5.0)
        stack.push_async_callback(ingest_client.close)
        meter = Meter(fleet, servers, quotas)
        env = Env(cfg, args.quota, settings, fleet, quotas, meter, nc, nc.jetstream(), client, ingest_client)
        corpus = plan_of(make_events(cfg.rebuild_docs, "rb", seed=0), max(1, cfg.rebuild_docs // 16), "rebuild")
        env.rebuild_docs = docs_in(corpus, REBUILD_APP)
        await asyncio.gather(*(rebuild_client.append_many(u, s, evs) for (u, s), evs in corpus.items()))
        try:
            for i, n in enumerate(cfg.replicas):
                status(f"[bold]N = {n} ({i + 1} of {len(cfg.replicas)}): {n} of each kind[/]")
                startup[n] = round(await grow(env, n, first=i == 0), 1)
                for run in (ingest, indexing, rebuild_step):
                    steps.append(await run(env, n))
                    say(steps[-1], args.quota)
                for step in await queries(env, n):
                    steps.append(step)
                    say(step, args.quota)
        except BaseException:
            for r in fleet.all():
                if not r.alive:
                    console.print(f"[red]{r.name} exited:[/]\n{r.log_tail()}")
            raise
    machine["wall_s"] = round(now() - started, 1)
    machine["load_average_end"] = list(os.getloadavg())
    verdicts = verdict_lines(steps, args.quota, machine["nproc"])
    print_results(machine, cfg, args, steps, verdicts)
    if args.json:
        write_json(args.json, machine, cfg, args, steps, startup, verdicts)
    failed = [s for s in steps if s.errors or not s.units]
    return 1 if failed else 0


def say(step: Step, quota: float) -> None:
    cores = " ".join(f"{c:.2f}" for c in step.replica_cores)
    status(
        f"  {step.op}: {step.units:,} in {step.seconds:.1f} s, {step.per_s:,.1f}/s; replicas {cores} cores"
        f"{f' (quota {quota:g})' if quota else ''}, servers {sum(v for k, v in step.servers_cores.items()):.2f}"
    )


# --- the verdict ---------------------------------------------------------------------------------


def verdict_lines(steps: list[Step], quota: float, cores: int) -> dict[str, str]:
    """For each step: did the largest N reach TARGET × N = 1 (scaled to its
    N), and if not, what ran short, from the CPU measured beside it."""
    out = {}
    for op in dict.fromkeys(s.op for s in steps):
        rows = sorted((s for s in steps if s.op == op), key=lambda s: s.replicas)
        one, top = rows[0], rows[-1]
        if one.replicas != 1 or top is one or not one.per_s:
            continue
        x = top.per_s / one.per_s
        want = TARGET * top.replicas / 4
        mean = statistics.mean(top.replica_cores) if top.replica_cores else 0.0
        throttled = statistics.mean(top.throttled) if top.throttled else 0.0
        servers = sum(top.servers_cores.values())
        base = statistics.mean(one.replica_cores) / one.per_s if one.replica_cores else 0.0
        cost = (mean * top.replicas / top.per_s) / base if base and top.per_s else 0.0
        head = f"{op}: {top.replicas} replicas {x:.2f}× one (target {want:.1f}×)"
        alone = statistics.mean(one.replica_cores) if one.replica_cores else 0.0
        if quota and alone < 0.85 * quota:
            head += f" [1 replica got only {alone:.2f} of its {quota:g} cores: the ratio flatters N]"
        if x >= want:
            out[op] = f"{head}: scales; each replica used {mean:.2f} cores, throttled in {throttled:.0%} of periods"
        elif top.machine_busy >= 0.9 and top.others >= 0.25:
            out[op] = (
                f"{head}: the machine is full and not with this benchmark: other processes took {top.others:.0%} "
                f"of {cores} cores, and the replicas got {mean:.2f} of their {quota or cores:g} cores "
                f"(the servers {servers:.2f}); measure again when the machine is quiet"
            )
        elif top.machine_busy >= 0.9:
            out[op] = (
                f"{head}: the machine is full ({top.machine_busy:.0%} of {cores} cores busy; the servers used "
                f"{servers:.2f} cores, others {top.others:.0%}): the servers' share is the bound"
            )
        elif quota and mean >= 0.85 * quota:
            out[op] = (
                f"{head}: every replica at its quota ({mean:.2f} of {quota:g} cores, throttled in {throttled:.0%} "
                f"of periods) with cores free: each unit cost {cost:.2f}× the CPU it did at N = 1"
            )
        else:
            out[op] = (
                f"{head}: replicas idle under their quota ({mean:.2f} of {quota or cores:g} cores) and cores free "
                f"({top.machine_busy:.0%} busy): they wait on something shared (a lock, the stream, a server's "
                f"single thread; servers {', '.join(f'{k} {v:.2f}' for k, v in top.servers_cores.items())} cores)"
            )
        if cost:
            out[op] += f"; the replicas' CPU per unit at N = {top.replicas}: {cost:.2f}× N = 1"
    return out


# --- output --------------------------------------------------------------------------------------


def ratio(step: Step, steps: list[Step]) -> float | None:
    one = next((s for s in steps if s.op == step.op and s.replicas == 1), None)
    return round(step.per_s / one.per_s, 2) if one and one.per_s else None


def print_results(machine: dict, cfg: Config, args, steps: list[Step], verdicts: dict[str, str]) -> None:
    console.print()
    quota = f"{args.quota:g} core per replica (cgroup {machine.get('cgroup')})" if args.quota else "no quota"
    console.print(
        f"[bold]memq scale-out under CPU quotas[/] ({args.mode}) — {machine['date']}, memq {machine['git']}\n"
        f"{machine['nproc']} cores, {machine['cpu']}, {quota}; servers unlimited; load average "
        f"{machine['load_average'][0]:.1f} at the start, {machine['load_average_end'][0]:.1f} at the end",
        highlight=False,
    )
    t = Table(title="throughput at a fixed per-replica quota (× = against 1 replica, same run)")
    for col in ("step", "kind", "N", "rate /s", "×", "cores per replica", "throttled", "servers' cores", "others"):
        t.add_column(col, justify="left" if col in ("step", "kind", "servers' cores") else "right")
    for s in steps:
        x = ratio(s, steps)
        t.add_row(
            s.op,
            s.kind,
            str(s.replicas),
            f"{s.per_s:,.1f}",
            f"{x:.2f}" if x is not None else "–",
            " ".join(f"{c:.2f}" for c in s.replica_cores),
            " ".join(f"{c:.0%}" for c in s.throttled) or "–",
            " ".join(f"{k} {v:.2f}" for k, v in s.servers_cores.items()),
            f"{s.others:.0%}",
        )
    console.print(t)
    for line in verdicts.values():
        console.print(f"- {line}", highlight=False)


def write_json(path: Path, machine: dict, cfg: Config, args, steps: list[Step], startup, verdicts) -> None:
    """The result in the docs' format (docs/_ext/memq_refs.py renders ``tables``),
    every step's figures beside it."""
    rows = []
    for s in steps:
        rows.append(
            {
                "step": s.op,
                "kind": s.kind,
                "n": s.replicas,
                "rate": s.per_s,
                "x": ratio(s, steps),
                "cores": s.replica_cores,
                "throttled": [round(100 * t) for t in s.throttled] or None,
                "servers": " / ".join(f"{v:.2f}" for v in s.servers_cores.values()),
                "busy": round(100 * s.machine_busy),
                "others": round(100 * s.others),
            }
        )
    names = " / ".join(next(iter(steps)).servers_cores) if steps else ""
    data = {
        "benchmark": "quota_scale",
        "script": "tests/bench/quota_scale.py",
        "measured": {
            "date": machine["date"][:10],
            "commit": machine["git"],
            "machine": f"{machine['nproc']} cores ({machine['cpu']})",
            "conditions": (
                f"`--{args.mode}`; "
                * (args.mode != "full")
                + f"{args.quota:g} core per replica (cgroup {machine.get('cgroup')}), servers unlimited; "
                f"load average {machine['load_average'][0]:.1f} at the start, "
                f"{machine['load_average_end'][0]:.1f} at the end"
                if args.quota
                else "no quota"
            ),
        },
        "tables": [
            {
                "columns": [
                    {"key": "step", "name": "step"},
                    {"key": "kind", "name": "kind"},
                    {"key": "n", "name": "N", "format": ",.0f"},
                    {"key": "rate", "name": "rate /s", "format": ",.1f"},
                    {"key": "x", "name": "× 1 replica", "format": ".2f"},
                    {"key": "cores", "name": "cores per replica", "format": ".2f"},
                    {"key": "throttled", "name": "throttled %", "format": ".0f"},
                    {"key": "servers", "name": f"servers' cores ({names})"},
                    {"key": "busy", "name": "machine busy %", "format": ".0f"},
                    {"key": "others", "name": "others %", "format": ".0f"},
                ],
                "rows": rows,
            }
        ],
        "verdicts": verdicts,
        "mode": args.mode,
        "quota": args.quota,
        "machine_info": machine,
        "config": asdict(cfg),
        "startup_s": startup,
        "steps": [asdict(s) for s in steps],
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    status(f"results written to {path}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", const="quick", dest="mode", help="a short run (~4 minutes)")
    size.add_argument(
        "--smoke", action="store_const", const="smoke", dest="mode", help="the smoke test's run: N = 1, 2, tiny"
    )
    parser.add_argument(
        "--quota", type=float, default=0.25, metavar="CORES", help="CPU per replica (0.25; 0: no limits)"
    )
    parser.add_argument("--replicas", type=int, nargs="+", metavar="N", help="replica counts (1 2 4)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results (the docs' format) here")
    parser.set_defaults(mode="full")
    return parser.parse_args()


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse_args())))
    except (KeyboardInterrupt, asyncio.CancelledError):
        status("[yellow]interrupted: every worker, server and cgroup this run made is gone[/]")
        sys.exit(130)
