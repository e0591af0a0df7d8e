"""Query benchmark: request/reply latency and throughput of the query worker.

Usage::

    .venv/bin/python tests/run_bench.py query [--quick | --smoke] [--json PATH]
        [--replicas 1,2] [--events 10000] [--sessions 100000] [--users 1000]

Everything runs on loopback, on servers this script starts and stops itself
(``tests/services.py``): one nats-server, one PostgreSQL and one Redis, one
``memq worker persistence`` and one ``memq worker indexing`` process, and 1
then 2 ``memq worker query`` processes (``MEMQ_CACHE__BACKEND=redis``;
``--replicas`` gives other counts, e.g. ``1,4,8`` on a many-core machine).
The index is the embedded one, keyword-only (``MEMQ_INDEXING__EMBEDDER=none``:
no Weaviate, no model), holding the seeded events, so a context's recall runs
(a BM25 search of the user's memories with the last user message) and finds
memories. It must: a context whose recall was skipped (no index, or too slow)
is never cached, so without one every "hit" would be a miss.

**Guard.** Each query worker serves ``/metrics`` (``MEMQ_METRICS__PORT``);
the cache lookups it counted (``memq_cache_requests_total`` by result) and
the recalls it skipped (``memq_recall_skipped_total``) are read before and
after each row. The run fails (``NotMeasured``) unless every request of a
"hit" row was a cache hit, every request of a "miss" row a miss, and no
context skipped its recall; the counts are in the JSON (``rows[].counted``).

**Sizes** (options): ``--events`` the large session's events (default
10,000; "10,000" below stands for it), ``--sessions`` the big
``sessions.list`` app's sessions, ``--users`` the users they are spread over.

**Data.** Seeded through ``MemoryClient`` and committed by the persistence
worker: a 10-event session and a 10,000-event session of realistic turns
(~20–60 tokens each, alternating user/assistant, a tool call/result pair
every 50 events). The 10,000-event session also gets a ``CheckpointSaved``
summary covering all but its last 20 events, as the summarizer would leave
it. Seeding waits until the persistence consumer's ack floor has passed the
last sequence; the replies are checked (10 events; 20 events after the
checkpoint, with its summary) before anything is timed.

**Raw baselines** (same run, same servers): a raw nats-py echo responder in
its own process (one subscription in a queue group, ``msg.respond(msg.data)``)
driven by the same load generator with the same request body as the cached
``history`` rows; the same responder answering with as many bytes as a cached
10-event history; and the cache hit's Redis call alone
(``RedisBackend.lookup``, one caller).

**Rows.** For N in (1, 2) query worker processes, op in (history, context)
× session in (10-event, 10,000-event) × cache in (hit, miss): requests/s and
p50/p99 with 64 concurrent requesters for a fixed time (``--quick`` 2 s, full
5 s), then p50/p99 with one requester (``--quick`` 0.4 s, full 2 s; ``--smoke``,
the smoke test's size, 0.3 s and 0.1 s with a few samples elsewhere: its
figures say only that every path answers). Requests
are raw ``nc.request`` calls with the exact body ``MemoryClient`` sends
(``build_request`` + ``encode_request``), strategy ``summary_buffer`` with
budget 8000, so the 10,000-event session starts at its checkpoint.
*hit*: one request repeated (a first one fills the cache: it is sent
again until a worker counts a hit, as a miss is stored after its reply).
*miss*: every request distinct — ``strategy.budget`` is 8000 + i with i unique in the whole
run, which changes the cache key but not the work (both sessions fit far
inside any such budget); so a miss takes the full path: Redis lookup, commit
floor, SQL, strategy (a context also recalls), Redis store. Redis is flushed before each row. Every
reply is checked (``{"ok":true`` …); errors are counted and shown. With 64
requesters p50 is mostly queueing (about 64 ÷ requests/s); one requester
shows the latency of a single request.

**Interleaved.** One requester sends the requests of a group in turn (echo,
history 10 hit, history 10,000 hit, echo, …; and context 10 miss, context
10,000 miss, …), so a slow moment of a shared machine hits all of them alike:
the steadiest form of the two target ratios.

**CPU.** For every 64-requester run: CPU µs per request of each process tree
(the responders, PostgreSQL with its backends, Redis, nats-server, this
process), and "others' CPU", the share of the machine used by processes
outside this benchmark — on a shared machine the main source of noise.

**sessions.list.** 10 sessions in one app and 100,000 (``--quick`` 20,000)
in another, inserted with SQL ``COPY`` into ``memq_sessions`` (through NATS
they would take minutes), with distinct ``updated_at``. p50/p99 of one
requester, page size 10 (the page is cached since issue 13, like a history:
the first request of each row reads SQL, the rest are hits): the first page; page 11 (10 cursors followed); a
page 90 % of the way down (a keyset cursor made as the service makes them);
a user-filtered first page. At 10 sessions there is only one page, so each
100k page is compared with that one.

**Client.** ``MemoryClient.history``/``context`` (typed request and reply)
on cache hits beside the same request sent raw: the client's own share.

Ratios are measured side by side in this run, never against remembered
numbers: cached history p50 ÷ raw echo p50 (target ≤ 2×), a miss of history
or context p50 ÷ raw echo p50 at one requester (target ≤ 3×), 10,000-event
context p50 ÷ 10-event context p50 (target ≤ 1.5×), sessions.list page at
100k ÷ at 10 (the issue asks for "as fast"; ≤ 1.5× is the tolerance used).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import asyncpg
import helpers
import nats
import orjson
import redis.asyncio as aioredis
import services
from nats.js.errors import NotFoundError
from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, status, warn_if_busy
from memq.contracts.client import MemoryClient, build_request, encode_request
from memq.contracts.codec import encode, msg_id, subject_for
from memq.contracts.ids import scope_key
from memq.contracts.schemas import CheckpointSaved, Event, Message, TextPart, ToolCallPart, ToolResultPart
from memq.contracts.subjects import EVENTS_STREAM, request_subject
from memq.workers.query.cache import RedisBackend, gen_keys
from memq.workers.sql.reads import encode_cursor

APP = "bench"
LIST_APPS = ("bench-list10", "bench-list100k")
USER = "u1"
SMALL, LARGE = "s10", "s10k"
DURABLE = "memq-persistence"
INDEXING_DURABLE = "memq-indexing"
ECHO_SUBJECT = "bench.echo"
CONCURRENCY = 64
BUDGET = 8000
KEEP_AFTER_CHECKPOINT = 20
PAGE = 10
MEMQ = Path(sys.prefix) / "bin" / "memq"
now = time.perf_counter


@dataclass(frozen=True)
class Config:
    seconds: float  # each 64-requester run
    seconds_c1: float  # each one-requester run
    list_sessions: int  # sessions in the big app
    list_samples: int  # requests per sessions.list row
    client_samples: int  # requests per MemoryClient row
    warmup: float  # unmeasured 64-requester run before each worker count
    paired_hits: int  # rounds of (echo, history 10, history 10,000), one requester
    paired_misses: int  # rounds of (context 10 miss, context 10,000 miss), one requester
    large_events: int = 10_000
    small_events: int = 10
    replicas: tuple[int, ...] = (1, 2)  # query worker processes, measured in turn
    list_users: int = 1000  # users the listing app's sessions are spread over


FULL = Config(
    seconds=5.0,
    seconds_c1=2.0,
    list_sessions=100_000,
    list_samples=400,
    client_samples=500,
    warmup=1.0,
    paired_hits=3000,
    paired_misses=600,
)
QUICK = Config(
    seconds=2.0,
    seconds_c1=0.4,
    list_sessions=20_000,
    list_samples=80,
    client_samples=100,
    warmup=0.3,
    paired_hits=400,
    paired_misses=120,
)
SMOKE = Config(  # tests/bench_smoke/test_bench_query.py: every path once, no figure worth reading
    seconds=0.3,
    seconds_c1=0.1,
    list_sessions=PAGE * 11,
    list_samples=5,
    client_samples=5,
    warmup=0.1,
    paired_hits=5,
    paired_misses=5,
    large_events=KEEP_AFTER_CHECKPOINT + 40,
    replicas=(1,),
    list_users=8,
)
MODES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}


@dataclass
class Load:
    """One measured run of the load generator."""

    concurrency: int
    seconds: float
    requests: int = 0
    errors: int = 0
    first_error: str = ""
    per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    reply_bytes: int = 0
    server_cpu_us: float = 0.0  # per request: the responders (query workers, or the echo process)
    client_cpu_us: float = 0.0  # per request: this process (the requesters)
    postgres_cpu_us: float = 0.0  # per request: PostgreSQL and its backends
    redis_cpu_us: float = 0.0
    nats_cpu_us: float = 0.0
    others_cpu: float = 0.0  # share of the machine used by processes outside the benchmark


@dataclass
class Row:
    replicas: int
    op: str
    session: str  # "10" or "10,000"
    cache: str  # hit | miss
    c64: Load | None = None
    c1: Load | None = None
    counted: dict | None = None  # the workers' own count of the row's requests (Counters)


@dataclass(frozen=True)
class Counters:
    """What the query workers counted (their /metrics, summed over the
    workers): cache lookups that hit and that missed, and recalls skipped."""

    hits: float = 0.0
    misses: float = 0.0
    recall_skipped: float = 0.0

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.hits + other.hits, self.misses + other.misses, self.recall_skipped + other.recall_skipped)

    def __sub__(self, before: Counters) -> Counters:
        return Counters(
            self.hits - before.hits, self.misses - before.misses, self.recall_skipped - before.recall_skipped
        )


def parse_counters(text: str) -> Counters:
    """The counters in one worker's Prometheus exposition."""
    hits = misses = skipped = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "memq_cache_requests_total":
                if sample.labels.get("result") == "hit":
                    hits += sample.value
                elif sample.labels.get("result") == "miss":
                    misses += sample.value
            elif sample.name == "memq_recall_skipped_total":
                skipped += sample.value
    return Counters(hits, misses, skipped)


async def read_counters(ports: list[int]) -> Counters:
    def scrape(port: int) -> Counters:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            return parse_counters(reply.read().decode())

    return sum(await asyncio.gather(*(asyncio.to_thread(scrape, port) for port in ports)), Counters())


class NotMeasured(RuntimeError):
    """A row's requests did not take the path its name says (the workers' counters show it)."""


def check_counted(row: Row, counted: Counters) -> None:
    """Fail loudly unless the workers served the row as it is labelled: a
    "hit" row from the cache (no lookup missed), a "miss" row by a miss each,
    and a context with its recall (a skipped recall leaves a context out of
    the cache: its "hit" row would time misses)."""
    assert row.c64 is not None and row.c1 is not None
    answered = row.c64.requests + row.c1.requests  # the timed ones; errors fail the run anyway
    wrong = []
    if row.op == "context" and counted.recall_skipped:
        wrong.append("recalls were skipped (is the index up?)")
    if row.cache == "hit" and (counted.misses or counted.hits < answered):
        wrong.append("not all served from the cache")
    if row.cache == "miss" and (counted.hits or counted.misses < answered):
        wrong.append("not all cache misses")
    if wrong:
        raise NotMeasured(
            f"{row.op} {row.session}-event {row.cache} ({row.replicas} worker(s)): {answered} requests answered; "
            f"the workers counted {counted.hits:.0f} cache hits, {counted.misses:.0f} misses and "
            f"{counted.recall_skipped:.0f} skipped recalls: " + "; ".join(wrong)
        )


@dataclass
class Results:
    echo_c64: Load | None = None
    echo_c1: Load | None = None
    blob_c64: Load | None = None  # echo responder replying with as many bytes as a cached history
    blob_c1: Load | None = None
    redis: dict = field(default_factory=dict)  # the cache hit's Redis call alone
    rows: list[Row] = field(default_factory=list)
    lists: list[dict] = field(default_factory=list)
    paired: list[dict] = field(default_factory=list)
    clients: list[dict] = field(default_factory=list)
    seed: dict = field(default_factory=dict)
    sanity: dict = field(default_factory=dict)
    large: str = "10,000"  # the large session's label: its number of events
    replicas: tuple[int, ...] = (1, 2)


# --- machine (as in ingest.py) ---------------------------------------------------------


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


# Root pids of the servers (set once they run): their CPU per request is
# reported beside the workers', to show where the time goes.
SERVICE_PIDS: dict[str, int] = {}


class CpuMeter:
    """CPU used between ``start()`` and ``stop()`` by process trees: the
    measured responders (workers or the echo), each server, and everything on
    the machine outside this benchmark ("others": other work on a shared
    machine is the main source of noise, so every row reports it).

    A tree's CPU includes its reaped children (cutime): a PostgreSQL backend
    that exits during a run is counted in the postmaster."""

    def __init__(self, responders: list[int]):
        self.groups = {"server": responders, **{k: [v] for k, v in SERVICE_PIDS.items()}, "mine": [os.getpid()]}

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> dict[str, float]:
        """Seconds of CPU per group, and ``others`` as a share of the machine."""
        after = self._sample()
        delta = {k: (after[k] - self.before[k]) for k in after}
        out = {k: delta[k] / _TICK for k in self.groups if k != "mine"}
        out["others"] = max(0.0, (delta["busy"] - delta["mine"]) / max(delta["total"], 1))
        return out

    def _sample(self) -> dict[str, int]:
        parents: dict[int, int] = {}
        ticks: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
                parents[int(entry)] = int(fields[1])
                ticks[int(entry)] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)

        def tree(roots: list[int]) -> int:
            total, todo = 0, list(roots)
            while todo:
                pid = todo.pop()
                total += ticks.get(pid, 0)
                todo += children.get(pid, [])
            return total

        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        sample = {k: tree(roots) for k, roots in self.groups.items()}
        sample["total"] = sum(values)
        sample["busy"] = sum(values) - values[3] - values[4]  # not idle, not iowait
        return sample


# --- processes -------------------------------------------------------------------------


class Proc:
    """A child process of this benchmark (a worker or the echo responder):
    killed by the kernel if the benchmark dies, SIGTERM then SIGKILL at the end."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path):
        self.cmd, self.env, self.log_path = cmd, env, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=services._die_with(os.getpid()),
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{' '.join(self.cmd[-2:])} exited ({self.proc.returncode}):\n{self.log_tail()}")

    def stop(self, grace_s: float = 5.0) -> bool:
        """True if it exited by itself within ``grace_s`` of SIGTERM."""
        if self.proc is None or self.proc.poll() is not None:
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
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def worker_env(nats_url: str, db_url: str, redis_url: str, work: Path) -> dict[str, str]:
    env = helpers.settings_env(helpers.make_settings(nats_url, db_url, work))
    env.update(
        MEMQ_DATABASE__MIGRATE_ON_START="false",  # migrated once, before the workers start
        MEMQ_CACHE__BACKEND="redis",
        MEMQ_CACHE__REDIS_URL=redis_url,
        # A keyword-only (BM25) embedded index, filled by `memq worker
        # indexing`: a context's recall runs (no model to load). Without an
        # index every recall is skipped, and a context without its recall is
        # never cached, so a "hit" row would be all misses.
        MEMQ_INDEXING__BACKEND="embedded",
        MEMQ_INDEXING__EMBEDDER="none",
    )
    return env


# The raw baseline: echo the payload on <subject>; on <subject>.blob.<n> reply
# with n bytes instead (a reply as large as a cached answer).
ECHO_CODE = """
import asyncio, sys, nats
from memq.workers.runtime.bus import settle
async def main():
    nc = await nats.connect(sys.argv[1], name="bench-echo")
    blobs = {}
    async def echo(msg):
        await msg.respond(msg.data)
    async def blob(msg):
        n = int(msg.subject.rsplit(".", 1)[1])
        await msg.respond(blobs.get(n) or blobs.setdefault(n, b"x" * n))
    await nc.subscribe(sys.argv[2], queue="bench-echo", cb=echo)
    await nc.subscribe(sys.argv[2] + ".blob.*", queue="bench-echo", cb=blob)
    await settle(nc)
    await asyncio.Event().wait()
asyncio.run(main())
"""


# --- workload -------------------------------------------------------------------------


CITIES = ["Lisbon", "Kyoto", "Montreal", "Oaxaca", "Tallinn", "Cape Town", "Hanoi", "Bergen", "Valparaíso", "Tbilisi"]
TOPICS = [
    ("a weekend trip", "train tickets and a small hotel near the old town"),
    ("my Python service", "a connection pool that runs dry under load"),
    ("a dinner party", "a vegetarian main course for eight people"),
    ("the quarterly report", "the revenue table and a short executive summary"),
    ("learning Portuguese", "a daily routine of twenty minutes with spaced repetition"),
    ("a flaky test", "a race between the worker shutdown and the last acknowledgement"),
    ("my running plan", "a half marathon in ten weeks with two easy runs a week"),
    ("moving apartments", "a checklist for utilities, internet and the change of address"),
]
USER_TURNS = [
    "Can you help me with {topic}? I am mostly worried about {detail}, and I only have about {n} hours this week.",
    "Thanks, that helps. What would you change if {city} were part of the plan, and how much would it cost roughly?",
    "I tried what you suggested for {topic} but {detail} is still a problem. Any other ideas?",
    "Could you summarise the three most important steps for {topic} in a short list?",
    "One more question: is it better to start with {detail} or leave it for the end?",
    "My colleague in {city} says the opposite. Who is right, and why?",
]
ASSISTANT_TURNS = [
    "Sure. For {topic}, start with {detail}: it is the part most likely to go wrong. Block {n} hours early in the "
    "week, and keep a short list of what is still open so nothing slips.",
    "If {city} is included, add a day for travel and expect around {n}0 euros more. The rest of the plan for {topic} "
    "stays the same, but I would move {detail} earlier.",
    "Then the cause is probably elsewhere. Check {detail} step by step, write down what you observe at each step, and "
    "compare it with what you expected. That usually narrows it down within an hour.",
    "1. Decide the goal for {topic}. 2. Deal with {detail} first. 3. Review after {n} days and adjust what did "
    "not work.",
    "Start with {detail}. Leaving it for the end means you discover problems when there is no time left to fix them.",
    "Both have a point: in {city} the constraints are different. For your case I would still follow the plan for "
    "{topic}, because {detail} matters more here.",
]


def make_events(n: int, tag: str, seed: int) -> list[Event]:
    """Alternating user/assistant turns of ~20–60 tokens; every 50 events an
    assistant tool call and its result take the place of an assistant turn and
    the next user turn."""
    rng = random.Random(seed)
    out: list[Event] = []
    i = 0
    while len(out) < n:
        topic, detail = TOPICS[(i // 40) % len(TOPICS)]
        slots = dict(topic=topic, detail=detail, city=rng.choice(CITIES), n=rng.randint(2, 9))
        if i % 50 == 23 and len(out) + 2 <= n:
            call_id = f"{tag}-call-{i}"
            args = {"city": slots["city"], "days": slots["n"]}
            call = Message(
                role="assistant",
                parts=[
                    TextPart(text=f"Let me check the forecast for {slots['city']} first."),
                    ToolCallPart(id=call_id, name="get_weather", args=args),
                ],
            )
            result = Message(
                role="tool",
                parts=[
                    ToolResultPart(
                        id=call_id,
                        name="get_weather",
                        result={"city": slots["city"], "forecast": "light rain, 14-19 °C", "wind_kmh": 12 + i % 20},
                    )
                ],
            )
            out += [Event(author=APP, message=call), Event(author="get_weather", message=result)]
            i += 2
            continue
        role = "user" if i % 2 == 0 else "assistant"
        templates = USER_TURNS if role == "user" else ASSISTANT_TURNS
        text = rng.choice(templates).format(**slots)
        message = Message(role=role, parts=[TextPart(text=text)])
        out.append(Event(author="user" if role == "user" else APP, message=message))
        i += 1
    return out


def make_summary(events: list[Event]) -> str:
    topics = sorted({t for t, _ in TOPICS})
    return (
        f"The user and the assistant have exchanged {len(events):,} messages. Topics so far: "
        + "; ".join(topics)
        + ". For each, the assistant suggested starting with the riskiest part, blocking time early in the week and "
        "keeping a short list of open points. The user asked several times about travel to "
        + ", ".join(CITIES[:6])
        + ", and the assistant checked the weather with the get_weather tool (mostly light rain, 14-19 °C). "
        "Open questions: the budget for the trip, whether the connection-pool problem is fixed, and the date of the "
        "half marathon. The user prefers short lists and concrete numbers, and answers in English."
    )


# --- load generator --------------------------------------------------------------------


async def run_load(nc, subject: str, bodies, concurrency: int, seconds: float, responders: list[int]) -> Load:
    """``concurrency`` requesters, each sending its next request as soon as the
    previous one is answered, for ``seconds``. ``bodies()`` returns the next
    request body (a fresh one for cache misses)."""
    load = Load(concurrency=concurrency, seconds=seconds)
    latencies: list[float] = []
    size = 0
    stop_at = 0.0

    async def requester() -> None:
        nonlocal size
        while now() < stop_at:
            body = bodies()
            t0 = now()
            try:
                msg = await nc.request(subject, body, timeout=10)
            except Exception as exc:  # timeouts, no responders
                load.errors += 1
                load.first_error = load.first_error or f"{type(exc).__name__}: {exc}"
                continue
            latencies.append(now() - t0)
            data = msg.data
            size = len(data)
            if not (data.startswith(b'{"ok":true') or subject.startswith(ECHO_SUBJECT)):
                load.errors += 1
                load.first_error = load.first_error or data[:300].decode(errors="replace")

    meter = CpuMeter(responders)
    meter.start()
    client0 = time.process_time()
    t0 = now()
    stop_at = t0 + seconds
    await asyncio.gather(*(requester() for _ in range(concurrency)))
    elapsed = now() - t0
    client = time.process_time() - client0
    cpu = meter.stop()
    load.others_cpu = cpu["others"]
    load.requests = len(latencies)
    load.per_s = len(latencies) / elapsed
    ms = [x * 1000 for x in latencies]
    load.p50_ms = statistics.median(ms) if ms else float("nan")
    load.p99_ms = percentile(ms, 99)
    load.reply_bytes = size
    n = max(len(latencies), 1)
    load.server_cpu_us = cpu["server"] / n * 1e6
    load.client_cpu_us = client / n * 1e6
    load.postgres_cpu_us = cpu.get("postgres", 0.0) / n * 1e6
    load.redis_cpu_us = cpu.get("redis", 0.0) / n * 1e6
    load.nats_cpu_us = cpu.get("nats", 0.0) / n * 1e6
    return load


async def run_samples(nc, subject: str, body: bytes, samples: int) -> tuple[float, float, dict]:
    """One requester, ``samples`` requests after 5 unmeasured ones: p50, p99, last reply."""
    ms = []
    reply = {}
    for i in range(samples + 5):
        t0 = now()
        msg = await nc.request(subject, body, timeout=10)
        if i >= 5:
            ms.append((now() - t0) * 1000)
        reply = orjson.loads(msg.data)
        if not reply.get("ok"):
            raise RuntimeError(f"{subject}: {reply.get('error')}")
    return statistics.median(ms), percentile(ms, 99), reply["result"]


class Bodies:
    """Request bodies exactly as MemoryClient sends them."""

    def __init__(self) -> None:
        self.counter = 0  # unique in the whole run: a miss body is never seen twice

    @staticmethod
    def request(op: str, session: str, budget: int = BUDGET) -> bytes:
        fields = dict(user=USER, session=session, strategy={"kind": "summary_buffer", "budget": budget})
        if op == "context":
            fields.update(format="memq", recall_limit=5)
        return encode_request(build_request(APP, op, **fields))

    def hit(self, op: str, session: str):
        body = self.request(op, session)
        return lambda: body

    def miss(self, op: str, session: str):
        # budget 8000 + i: a new cache key, the same work (both sessions fit in 8000).
        # The body is built once with a placeholder budget, then only that number changes.
        placeholder = 7_654_321
        template = self.request(op, session, budget=placeholder)
        marker = b"%d" % placeholder
        assert template.count(marker) == 1

        def next_body() -> bytes:
            self.counter += 1
            return template.replace(marker, b"%d" % (BUDGET + self.counter))

        return next_body


# --- setup -------------------------------------------------------------------------------


async def seed_sessions(nats_url: str, js, cfg: Config, results: Results) -> None:
    """The 10- and 10,000-event sessions and the checkpoint, through NATS."""
    t0 = now()
    async with await MemoryClient.connect(nats_url, app=APP) as client:
        last = 0
        for session, n, seed in ((SMALL, cfg.small_events, 1), (LARGE, cfg.large_events, 2)):
            await client.create_session(USER, session, state={"topic": "planning", "user:language": "en"})
            events = make_events(n, session, seed)
            seqs = await client.append_many(USER, session, events)
            last = max(last, *seqs)
            if session == LARGE:
                cut = len(events) - KEEP_AFTER_CHECKPOINT - 1  # the last event folded into the summary
                assert not events[cut].message.parts[-1].type == "tool_call", "checkpoint would split a tool call"
                checkpoint = CheckpointSaved(
                    app=APP, user=USER, session=session, summary=make_summary(events[: cut + 1]), up_to_seq=seqs[cut]
                )
                ack = await js.publish(
                    subject_for(checkpoint), encode(checkpoint), headers={"Nats-Msg-Id": msg_id(checkpoint)}
                )
                last = max(last, ack.seq)
                results.seed["checkpoint_up_to_seq"] = seqs[cut]
                results.seed["summary_chars"] = len(checkpoint.summary)
    published = now()
    await wait_for_ack_floor(js, DURABLE, last)
    committed = now()
    await wait_for_ack_floor(js, INDEXING_DURABLE, last)  # the memories a context recalls
    results.seed.update(
        events=cfg.small_events + cfg.large_events,
        last_seq=last,
        publish_s=round(published - t0, 2),
        committed_s=round(committed - t0, 2),
        indexed_s=round(now() - t0, 2),
    )


async def wait_for_ack_floor(js, durable: str, last: int, timeout: float = 180) -> None:
    """Until ``durable``'s ack floor has passed ``last`` (it has handled every seeded event)."""
    deadline = now() + timeout
    while True:
        try:
            floor = (await js.consumer_info(EVENTS_STREAM, durable)).ack_floor.stream_seq
        except NotFoundError:
            floor = 0
        if floor >= last:
            return
        if now() > deadline:
            raise TimeoutError(f"{durable}: ack floor {floor} below {last} after {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def seed_list_sessions(dsn: str, cfg: Config) -> dict:
    """10 and N sessions straight into memq_sessions with COPY (not through NATS)."""
    t0 = now()
    conn = await asyncpg.connect(dsn)
    try:
        records = []
        base = 1_700_000_000.0
        for app, count in zip(LIST_APPS, (10, cfg.list_sessions)):
            for i in range(count):
                user, session = f"user{i % cfg.list_users}", f"sess-{i:07d}"
                records.append(
                    (
                        scope_key(app, user, session),
                        scope_key(app, user),
                        app,
                        user,
                        session,
                        1 + i,
                        0,
                        base + i * 0.001,
                        base + i * 0.5 + 0.25,
                    )
                )
        columns = [
            "key",
            "user_key",
            "app",
            "user_id",
            "session_id",
            "last_seq",
            "deleted_seq",
            "created_at",
            "updated_at",
        ]
        await conn.copy_records_to_table("memq_sessions", records=records, columns=columns)
        await conn.execute("ANALYZE memq_sessions")
    finally:
        await conn.close()
    return {"rows": len(records), "seconds": round(now() - t0, 2)}


async def wait_for_query_workers(nc, workers: list[Proc], timeout: float = 60.0) -> None:
    """Until N micro-service instances answer PING and a session.get is ok."""
    deadline = now() + timeout
    ping_inbox = nc.new_inbox()
    seen: set[str] = set()

    async def on_pong(msg) -> None:
        if msg.data:  # "no responders" statuses arrive here empty until a worker subscribes
            seen.add(orjson.loads(msg.data).get("id", ""))

    sub = await nc.subscribe(ping_inbox, cb=on_pong)
    body = encode_request(build_request(APP, "session.get", user=USER, session=SMALL))
    try:
        while True:
            for w in workers:
                w.check_alive()
            seen.clear()
            await nc.publish("$SRV.PING.memq-query", b"", reply=ping_inbox)
            await asyncio.sleep(0.2)
            if len(seen) >= len(workers):
                try:
                    msg = await nc.request(request_subject(APP, "session.get"), body, timeout=2)
                    if orjson.loads(msg.data).get("ok"):
                        return
                except Exception:
                    pass
            if now() > deadline:
                raise TimeoutError(f"{len(workers)} query workers not answering after {timeout:.0f}s ({len(seen)} do)")
    finally:
        await sub.unsubscribe()


# --- the measured runs -------------------------------------------------------------------


async def measure_echo(nc, cfg: Config, echo: Proc, bodies: Bodies, results: Results) -> None:
    payload = bodies.request("history", SMALL)
    size = results.sanity[f"history/{SMALL}"]["reply_bytes"]
    blob_subject = f"{ECHO_SUBJECT}.blob.{size}"
    await run_load(nc, ECHO_SUBJECT, lambda: payload, CONCURRENCY, 0.3, [])  # warm-up
    results.echo_c64 = await run_load(nc, ECHO_SUBJECT, lambda: payload, CONCURRENCY, cfg.seconds, [echo.pid])
    results.echo_c1 = await run_load(nc, ECHO_SUBJECT, lambda: payload, 1, cfg.seconds_c1, [echo.pid])
    results.blob_c64 = await run_load(nc, blob_subject, lambda: payload, CONCURRENCY, cfg.seconds, [echo.pid])
    results.blob_c1 = await run_load(nc, blob_subject, lambda: payload, 1, cfg.seconds_c1, [echo.pid])
    runs = (("echo", results.echo_c64, results.echo_c1), (f"{size:,} B reply", results.blob_c64, results.blob_c1))
    for label, c64, c1 in runs:
        status(
            f"    {label:<14}: {c64.per_s:7,.0f} req/s, p50 {c64.p50_ms:6.2f} ms, p99 {c64.p99_ms:6.2f} ms; "
            f"one requester p50 {c1.p50_ms:.3f} ms"
        )


async def measure_redis(redis_url: str, cfg: Config, results: Results) -> None:
    """The Redis call of a cache hit alone (the worker's own RedisBackend.lookup:
    generations and entry in one script call), one caller, from this process."""
    size = results.sanity[f"history/{SMALL}"]["reply_bytes"]
    backend = RedisBackend(redis_url, ttl_s=60)
    try:
        keys, prefix = gen_keys(APP, USER, SMALL), "memq:q:e:bench-redis-baseline"
        suffix, _ = await backend.lookup(keys, prefix)  # starts the counters
        await backend.store(prefix + suffix, b"x" * size, 60)
        ms = []
        stop_at = now() + cfg.seconds_c1
        while now() < stop_at:
            t0 = now()
            _, value = await backend.lookup(keys, prefix)
            ms.append((now() - t0) * 1000)
            assert value is not None and len(value) == size
    finally:
        await backend.close()
    results.redis = dict(requests=len(ms), p50_ms=statistics.median(ms), p99_ms=percentile(ms, 99), value_bytes=size)
    status(f"    RedisBackend.lookup ({size:,} B value), one caller: p50 {results.redis['p50_ms']:.3f} ms")


async def sanity_check(nc, results: Results) -> None:
    """What the measured requests return (so a fast wrong answer cannot pass)."""
    out = {}
    for op in ("history", "context"):
        for session in (SMALL, LARGE):
            msg = await nc.request(request_subject(APP, op), Bodies.request(op, session), timeout=10)
            reply = orjson.loads(msg.data)
            if not reply.get("ok"):
                raise RuntimeError(f"{op} {session}: {reply.get('error')}")
            r = reply["result"]
            if op == "history":
                out[f"history/{session}"] = {
                    "events": len(r["events"]),
                    "tokens": r["tokens"],
                    "checkpoint_seq": r.get("checkpoint_seq"),
                    "summary": r.get("summary") is not None,
                    "reply_bytes": len(msg.data),
                }
            else:
                out[f"context/{session}"] = {
                    "messages": len(r["messages"]),
                    "tokens": r["tokens"],
                    "reply_bytes": len(msg.data),
                }
    results.sanity = out
    h10, h10k = out[f"history/{SMALL}"], out[f"history/{LARGE}"]
    assert h10["events"] == 10 and h10["checkpoint_seq"] is None, h10
    assert h10k["events"] == KEEP_AFTER_CHECKPOINT, h10k
    assert h10k["checkpoint_seq"] == results.seed["checkpoint_up_to_seq"] and h10k["summary"], h10k
    for session in (SMALL, LARGE):  # the recall ran and found memories (of the user's other session, too)
        assert out[f"context/{session}"]["tokens"]["recalled"] > 0, out[f"context/{session}"]


async def fill_cache(nc, subject: str, body: bytes, ports: list[int], tries: int = 200) -> None:
    """Send ``body`` until every worker has counted it as a cache hit. One
    request is not enough: a miss is stored after its reply is sent, and a
    replica whose own tier still holds the answer from before the row (Redis
    is flushed, its tier is not) hits without storing it in Redis, so the
    other replica's first concurrent requests would all miss."""
    start = [await read_counters([port]) for port in ports]
    for _ in range(tries):
        await nc.request(subject, body, timeout=10)
        now_ = [await read_counters([port]) for port in ports]
        if all((n - s).hits for n, s in zip(now_, start, strict=True)):
            return
        await asyncio.sleep(0.01)
    raise NotMeasured(f"{subject}: not a cache hit on every worker after {tries} requests (is its answer kept?)")


async def measure_ops(
    nc, rds, cfg: Config, replicas: int, workers: list[Proc], ports: list[int], bodies: Bodies, results: Results
):
    """The rows; each checked against the workers' counters (``ports``: their /metrics)."""
    pids = [w.pid for w in workers]
    # Warm-up: open every worker's SQL pool and Redis connections (not measured).
    await rds.flushdb()
    await run_load(nc, request_subject(APP, "context"), bodies.miss("context", LARGE), CONCURRENCY, cfg.warmup, pids)
    for op in ("history", "context"):
        subject = request_subject(APP, op)
        for session, label in ((SMALL, "10"), (LARGE, results.large)):
            for cache in ("hit", "miss"):
                await rds.flushdb()
                row = Row(replicas=replicas, op=op, session=label, cache=cache)
                if cache == "hit":
                    source = bodies.hit(op, session)
                    await fill_cache(nc, subject, source(), ports)
                else:
                    source = bodies.miss(op, session)
                before = await read_counters(ports)
                row.c64 = await run_load(nc, subject, source, CONCURRENCY, cfg.seconds, pids)
                row.c1 = await run_load(nc, subject, source, 1, cfg.seconds_c1, pids)
                for w in workers:
                    w.check_alive()
                counted = await read_counters(ports) - before
                row.counted = asdict(counted)
                check_counted(row, counted)
                results.rows.append(row)
                errors = row.c64.errors + row.c1.errors
                status(
                    f"    {op:<7} {label:>6}-event {cache:<4}: {row.c64.per_s:7,.0f} req/s, "
                    f"p50 {row.c64.p50_ms:6.2f} ms, p99 {row.c64.p99_ms:6.2f} ms; one requester p50 "
                    f"{row.c1.p50_ms:.2f} ms" + (f"  [red]{errors} errors[/]" if errors else "")
                )


async def run_paired(nc, items: list[tuple[str, str, object]], rounds: int) -> dict[str, tuple[float, float]]:
    """One requester, the requests of ``items`` taken in turn (A B C A B C …):
    a slow moment of the machine hits all of them alike, so their ratio is
    steadier than that of two runs one after the other. label -> (p50, p99)."""
    ms: dict[str, list[float]] = {label: [] for label, _, _ in items}
    for i in range(rounds + 5):
        for label, subject, bodies in items:
            body = bodies()
            t0 = now()
            msg = await nc.request(subject, body, timeout=10)
            if i >= 5:
                ms[label].append((now() - t0) * 1000)
            if not (msg.data.startswith(b'{"ok":true') or subject.startswith(ECHO_SUBJECT)):
                raise RuntimeError(f"{label}: {msg.data[:300]!r}")
    return {label: (statistics.median(v), percentile(v, 99)) for label, v in ms.items()}


async def measure_paired(nc, rds, cfg: Config, replicas: int, bodies: Bodies, results: Results) -> None:
    await rds.flushdb()
    hist, ctx = request_subject(APP, "history"), request_subject(APP, "context")
    echo_body = bodies.request("history", SMALL)
    hits = [
        ("raw echo", ECHO_SUBJECT, lambda: echo_body),
        ("history 10 hit", hist, bodies.hit("history", SMALL)),
        (f"history {results.large} hit", hist, bodies.hit("history", LARGE)),
    ]
    for _, subject, source in hits[1:]:
        await nc.request(subject, source(), timeout=10)  # fills the cache
    misses = [
        ("context 10 miss", ctx, bodies.miss("context", SMALL)),
        (f"context {results.large} miss", ctx, bodies.miss("context", LARGE)),
    ]
    for kind, items, rounds in (("hits", hits, cfg.paired_hits), ("misses", misses, cfg.paired_misses)):
        got = await run_paired(nc, items, rounds)
        for label, (p50, p99) in got.items():
            results.paired.append(
                dict(replicas=replicas, group=kind, what=label, rounds=rounds, p50_ms=p50, p99_ms=p99)
            )
        status("    interleaved " + ", ".join(f"{label} p50 {p50:.3f} ms" for label, (p50, _) in got.items()))


async def measure_lists(nc, cfg: Config, results: Results) -> None:
    small_app, big_app = LIST_APPS
    n = cfg.list_samples

    async def page(app: str, label: str, sessions: int, depth: str, **fields) -> dict:
        body = encode_request(build_request(app, "sessions.list", limit=PAGE, **fields))
        p50, p99, result = await run_samples(nc, request_subject(app, "sessions.list"), body, n)
        row = dict(app_sessions=sessions, page=label, depth=depth, rows=len(result["sessions"]), p50_ms=p50, p99_ms=p99)
        results.lists.append(row)
        status(f"    {sessions:>7,} sessions, {label:<28}: p50 {p50:.2f} ms, p99 {p99:.2f} ms ({row['rows']} rows)")
        return result

    await page(small_app, "first page (the only one)", 10, "first")
    first = await page(big_app, "first page", cfg.list_sessions, "first")
    cursor = first["next_cursor"]
    for _ in range(9):  # pages 2..10
        body = encode_request(build_request(big_app, "sessions.list", limit=PAGE, cursor=cursor))
        msg = await nc.request(request_subject(big_app, "sessions.list"), body, timeout=10)
        cursor = orjson.loads(msg.data)["result"]["next_cursor"]
    await page(big_app, "page 11 (10 cursors followed)", cfg.list_sessions, "deep", cursor=cursor)
    # A cursor 90 % of the way down, as the service would have handed it out.
    i = cfg.list_sessions // 10
    user, session = f"user{i % cfg.list_users}", f"sess-{i:07d}"
    far = encode_cursor(1_700_000_000.0 + i * 0.5 + 0.25, scope_key(big_app, user, session))
    await page(big_app, "page at 90 % (keyset cursor)", cfg.list_sessions, "very deep", cursor=far)
    await page(big_app, "first page of one user", cfg.list_sessions, "user", user=f"user{7 % cfg.list_users}")


async def measure_clients(nats_url: str, nc, cfg: Config, results: Results) -> None:
    """MemoryClient (typed) vs the same request sent raw, cache hits, one requester."""
    async with await MemoryClient.connect(nats_url, app=APP, consistent=False) as client:
        for op in ("history", "context"):
            for session, label in ((SMALL, "10"), (LARGE, results.large)):
                strategy = {"kind": "summary_buffer", "budget": BUDGET}
                call = getattr(client, op)
                await call(USER, session, strategy=strategy)  # warm
                ms = []
                for _ in range(cfg.client_samples):
                    t0 = now()
                    await call(USER, session, strategy=strategy)
                    ms.append((now() - t0) * 1000)
                raw, _, _ = await run_samples(
                    nc, request_subject(APP, op), Bodies.request(op, session), cfg.client_samples
                )
                results.clients.append(dict(op=op, session=label, client_p50_ms=statistics.median(ms), raw_p50_ms=raw))


# --- one run -------------------------------------------------------------------------------


async def run(cfg: Config, machine: dict, work: Path) -> Results:
    results = Results(large=f"{cfg.large_events:,}", replicas=cfg.replicas)
    bodies = Bodies()
    async with AsyncExitStack() as stack:
        status("starting nats-server, PostgreSQL, Redis …")
        nats_server = stack.enter_context(services.NatsServer())
        pg = stack.enter_context(services.Postgres())
        redis_server = stack.enter_context(services.Redis())
        SERVICE_PIDS.update(postgres=pg.pid, redis=redis_server.pid, nats=nats_server.pid)
        machine["postgres"] = pg.psql("SHOW server_version").strip()
        machine["redis"] = (
            subprocess.run([redis_server.binary, "--version"], capture_output=True, text=True)
            .stdout.split()[2]
            .removeprefix("v=")
        )
        db_url = pg.create_database("bench_query")
        engine = await helpers.migrated_engine(db_url)
        await engine.dispose()
        env = worker_env(nats_server.url, db_url, redis_server.url, work)

        procs: list[Proc] = []

        async def stop_all() -> None:
            clean = await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))
            if not all(clean):
                status(f"  [yellow]{clean.count(False)} processes did not stop within 5 s of SIGTERM: killed[/]")

        stack.push_async_callback(stop_all)

        def launch(cmd: list[str], name: str, **extra_env: str) -> Proc:
            p = Proc(cmd, {**env, **extra_env}, work / f"{name}.log").start()
            procs.append(p)
            return p

        nc = await nats.connect(nats_server.url, name="bench-query")
        stack.push_async_callback(nc.close)
        js = nc.jetstream()
        rds = aioredis.from_url(redis_server.url)
        stack.push_async_callback(rds.aclose)
        try:
            persistence = launch([str(MEMQ), "worker", "persistence"], "persistence")
            launch([str(MEMQ), "worker", "indexing"], "indexing")
            status(f"seeding sessions.list apps: 10 and {cfg.list_sessions:,} sessions with COPY …")
            results.seed["list"] = await seed_list_sessions(pg.dsn("bench_query"), cfg)
            status(f"seeding through MemoryClient: {cfg.small_events} + {cfg.large_events:,} events and a checkpoint …")
            deadline = now() + 60
            while True:  # the worker creates the streams and its durable consumer
                persistence.check_alive()
                try:
                    await js.consumer_info(EVENTS_STREAM, DURABLE)
                    break
                except NotFoundError:
                    if now() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            await seed_sessions(nats_server.url, js, cfg, results)
            status(f"  published in {results.seed['publish_s']} s, committed after {results.seed['committed_s']} s")

            query: list[Proc] = []
            metric_ports: dict[int, int] = {}
            for replicas in cfg.replicas:
                while len(query) < replicas:
                    port = services.free_port()  # its /metrics: the cache counters the hit rows are checked by
                    worker = launch([str(MEMQ), "worker", "query"], f"query{len(query)}", MEMQ_METRICS__PORT=str(port))
                    metric_ports[worker.pid] = port
                    query.append(worker)
                await wait_for_query_workers(nc, query)
                first = replicas == cfg.replicas[0]
                if first:
                    await sanity_check(nc, results)
                    # Baselines beside the (idle) worker, on the same servers.
                    status("[bold]raw nats-py request/reply echo[/] (its own process) and Redis alone")
                    echo = launch([sys.executable, "-c", ECHO_CODE, nats_server.url, ECHO_SUBJECT], "echo")
                    for _ in range(100):
                        try:
                            await nc.request(ECHO_SUBJECT, b"ping", timeout=0.5)
                            break
                        except Exception:
                            echo.check_alive()
                            await asyncio.sleep(0.1)
                    await measure_echo(nc, cfg, echo, bodies, results)  # it stays up, idle, for the paired runs
                    await measure_redis(redis_server.url, cfg, results)
                status(f"[bold]{replicas} query worker{'s' if replicas > 1 else ''}[/] (Redis cache)")
                await measure_ops(nc, rds, cfg, replicas, query, [metric_ports[w.pid] for w in query], bodies, results)
                await measure_paired(nc, rds, cfg, replicas, bodies, results)
                if first:
                    status(f"[bold]sessions.list[/] ({replicas} query worker(s), one requester, page size 10)")
                    await measure_lists(nc, cfg, results)
                    status("[bold]MemoryClient vs raw request[/] (cache hits, one requester)")
                    await measure_clients(nats_server.url, nc, cfg, results)
        except BaseException:
            for p in procs:
                console.print(f"[red]{' '.join(p.cmd[-2:])} log:[/]\n{p.log_tail()}")
            raise
    return results


# --- output --------------------------------------------------------------------------------


def find(results: Results, replicas: int, op: str, session: str, cache: str) -> Row:
    return next(r for r in results.rows if (r.replicas, r.op, r.session, r.cache) == (replicas, op, session, cache))


def ratios(results: Results) -> list[dict]:
    """The targets, each computed from numbers of this run."""
    out = []
    e64, e1 = results.echo_c64, results.echo_c1
    for n in results.replicas:
        for session in ("10", results.large):
            row = find(results, n, "history", session, "hit")
            for conc, load, echo in (("1", row.c1, e1), ("64", row.c64, e64)):
                out.append(
                    dict(
                        what=f"cached history p50 ÷ raw echo p50 ({session}-event, {n} worker{'s' if n > 1 else ''}, "
                        f"{conc} requester{'s' if conc != '1' else ''})",
                        value=load.p50_ms / echo.p50_ms,
                        target=2.0,
                    )
                )
    for n in results.replicas:
        row = find(results, n, "history", "10", "hit")
        for conc, load, blob in (("1", row.c1, results.blob_c1), ("64", row.c64, results.blob_c64)):
            out.append(
                dict(
                    what=f"  for comparison: ÷ raw echo with a reply as large ({n} worker{'s' if n > 1 else ''}, "
                    f"{conc} requester{'s' if conc != '1' else ''})",
                    value=load.p50_ms / blob.p50_ms,
                    target=None,
                )
            )
    for n in results.replicas:
        for op in ("history", "context"):
            for session in ("10", results.large):
                row = find(results, n, op, session, "miss")
                out.append(
                    dict(
                        what=f"{op} miss p50 ÷ raw echo p50 ({session}-event, {n} worker{'s' if n > 1 else ''}, "
                        "1 requester)",
                        value=row.c1.p50_ms / e1.p50_ms,
                        target=3.0,
                    )
                )
    paired = {(r["replicas"], r["what"]): r["p50_ms"] for r in results.paired}
    for n in results.replicas:
        for session in ("10", results.large):
            out.append(
                dict(
                    what=f"cached history p50 ÷ raw echo p50 ({session}-event, {n} worker{'s' if n > 1 else ''}, "
                    "1 requester, interleaved)",
                    value=paired[(n, f"history {session} hit")] / paired[(n, "raw echo")],
                    target=2.0,
                )
            )
    for n in results.replicas:
        for cache in ("miss", "hit"):
            small, large = find(results, n, "context", "10", cache), find(results, n, "context", results.large, cache)
            for conc, a, b in (("1", large.c1, small.c1), ("64", large.c64, small.c64)):
                out.append(
                    dict(
                        what=f"{results.large}-event context p50 ÷ 10-event ({cache}, {n} worker{'s' if n > 1 else ''}, "
                        f"{conc} requester{'s' if conc != '1' else ''})",
                        value=a.p50_ms / b.p50_ms,
                        target=1.5,
                    )
                )
    for n in results.replicas:
        out.append(
            dict(
                what=f"{results.large}-event context p50 ÷ 10-event (miss, {n} worker{'s' if n > 1 else ''}, "
                "1 requester, interleaved)",
                value=paired[(n, f"context {results.large} miss")] / paired[(n, "context 10 miss")],
                target=1.5,
            )
        )
    lists = {(r["app_sessions"], r["depth"]): r for r in results.lists}
    base = next(r for (s, d), r in lists.items() if s == 10)
    for (sessions, depth), r in lists.items():
        if sessions != 10 and depth in ("deep", "very deep", "first"):
            # The issue asks for "as fast as at 10"; 1.5× is the tolerance used here.
            out.append(
                dict(
                    what=f"sessions.list {r['page']} at {sessions:,} ÷ at 10 (p50)",
                    value=r["p50_ms"] / base["p50_ms"],
                    target=1.5,
                )
            )
    return out


def print_results(machine: dict, cfg: Config, mode: str, results: Results) -> None:
    console.print()
    console.print(
        f"[bold]memq query benchmark[/] ({mode}) — {machine['date']}, memq {machine['git']}\n"
        f"{machine['nproc']} cores, {machine['cpu']}, Python {machine['python']}, {machine['nats_server']}, "
        f"PostgreSQL {machine.get('postgres', '?')}, Redis {machine.get('redis', '?')}, "
        f"CPU {machine['cpu_busy_at_start']:.0%} busy before the run"
    )
    table = Table(
        title=f"history / context: {CONCURRENCY} requesters for {cfg.seconds:g} s, then 1 for {cfg.seconds_c1:g} s"
    )
    for col in (
        "path",
        "workers",
        "session",
        "cache",
        "req/s",
        "p50 ms",
        "p99 ms",
        "1-req p50",
        "1-req p99",
        "reply B",
        "responder CPU µs/req",
        "client CPU µs/req",
        "others' CPU",
        "errors",
    ):
        table.add_column(col, justify="left" if col in ("path", "cache") else "right")

    def add(path, workers, session, cache, c64: Load, c1: Load) -> None:
        errors = c64.errors + c1.errors
        table.add_row(
            path,
            workers,
            session,
            cache,
            f"{c64.per_s:,.0f}",
            f"{c64.p50_ms:.2f}",
            f"{c64.p99_ms:.2f}",
            f"{c1.p50_ms:.2f}",
            f"{c1.p99_ms:.2f}",
            f"{c64.reply_bytes:,}",
            f"{c64.server_cpu_us:,.0f}",
            f"{c64.client_cpu_us:,.0f}",
            f"{c64.others_cpu:.0%}/{c1.others_cpu:.0%}",
            f"[red]{errors}[/]" if errors else "0",
        )

    add("raw echo", "1", "-", "-", results.echo_c64, results.echo_c1)
    add(f"raw echo, {results.blob_c64.reply_bytes:,} B reply", "1", "-", "-", results.blob_c64, results.blob_c1)
    for r in results.rows:
        add(r.op, str(r.replicas), r.session, r.cache, r.c64, r.c1)
    console.print(table)
    console.print(
        "Requests are raw nc.request calls with MemoryClient's exact body (strategy summary_buffer, budget 8000). "
        "miss: strategy.budget = 8000 + i, unique per request (new cache key, same work); Redis flushed before each "
        "row. responder CPU: the echo process's or the query workers' CPU per request over the 64-requester run. "
        "others' CPU: share of the machine used by processes outside this benchmark during the 64-requester / "
        f"one-requester run. The cache hit's Redis call alone (RedisBackend.lookup, one caller): p50 "
        f"{results.redis['p50_ms']:.3f} ms, p99 {results.redis['p99_ms']:.3f} ms.",
        highlight=False,
    )
    busy = [r for r in results.rows if max(r.c64.others_cpu, r.c1.others_cpu) >= 0.15]
    if busy or max(results.echo_c64.others_cpu, results.echo_c1.others_cpu) >= 0.15:
        status(f"[yellow]other processes used ≥ 15 % of the machine during {len(busy)} rows (others' CPU): noisy[/]")
    for row in results.rows:
        for load in (row.c64, row.c1):
            if load.first_error:
                status(f"[red]{row.op} {row.session} {row.cache} ({row.replicas}): {load.first_error}[/]")

    cpu = Table(title=f"where the CPU goes: µs of CPU per request by process tree, {CONCURRENCY} requesters")
    for col in (
        "path",
        "workers",
        "session",
        "cache",
        "responder",
        "PostgreSQL",
        "Redis",
        "nats-server",
        "requesters",
        "total",
        "req/s",
        "others' CPU",
    ):
        cpu.add_column(col, justify="left" if col in ("path", "cache") else "right")

    def add_cpu(path, workers, session, cache, c: Load) -> None:
        parts = (c.server_cpu_us, c.postgres_cpu_us, c.redis_cpu_us, c.nats_cpu_us, c.client_cpu_us)
        cpu.add_row(
            path,
            workers,
            session,
            cache,
            *(f"{v:,.0f}" for v in parts),
            f"{sum(parts):,.0f}",
            f"{c.per_s:,.0f}",
            f"{c.others_cpu:.0%}",
        )

    add_cpu("raw echo", "1", "-", "-", results.echo_c64)
    add_cpu(f"raw echo, {results.blob_c64.reply_bytes:,} B reply", "1", "-", "-", results.blob_c64)
    for r in results.rows:
        add_cpu(r.op, str(r.replicas), r.session, r.cache, r.c64)
    console.print(cpu)
    status(
        f"The machine has {machine['nproc']} cores = {machine['nproc'] * 1e6:,.0f} µs of CPU per second; a total of T "
        f"µs/request caps the rate near {machine['nproc']:,} × 1e6 / T requests/s, whatever the number of workers."
    )

    pt = Table(title="interleaved, one requester (A B C A B C …)")
    for col in ("workers", "group", "request", "rounds", "p50 ms", "p99 ms"):
        pt.add_column(col, justify="left" if col in ("group", "request") else "right")
    for r in results.paired:
        pt.add_row(
            str(r["replicas"]), r["group"], r["what"], f"{r['rounds']:,}", f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}"
        )
    console.print(pt)

    lt = Table(title=f"sessions.list (1 query worker, one requester, {cfg.list_samples} requests, page size {PAGE})")
    for col in ("sessions in app", "page", "rows", "p50 ms", "p99 ms"):
        lt.add_column(col, justify="left" if col == "page" else "right")
    for r in results.lists:
        lt.add_row(f"{r['app_sessions']:,}", r["page"], str(r["rows"]), f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}")
    console.print(lt)

    ct = Table(
        title=f"MemoryClient (typed) vs raw request, cache hit, 1 worker, one requester, {cfg.client_samples} requests"
    )
    for col in ("op", "session", "MemoryClient p50 ms", "raw p50 ms", "÷ raw"):
        ct.add_column(col, justify="left" if col == "op" else "right")
    for c in results.clients:
        ct.add_row(
            c["op"],
            c["session"],
            f"{c['client_p50_ms']:.2f}",
            f"{c['raw_p50_ms']:.2f}",
            f"{c['client_p50_ms'] / c['raw_p50_ms']:.2f}",
        )
    console.print(ct)

    rt = Table(title="ratios (same run)")
    for col in ("ratio", "value", "target", "met"):
        rt.add_column(col, justify="left" if col == "ratio" else "right")
    for r in ratios(results):
        if r["target"] is None:
            rt.add_row(r["what"], f"{r['value']:.2f}×", "-", "-")
        else:
            met = r["value"] <= r["target"]
            rt.add_row(r["what"], f"{r['value']:.2f}×", f"≤ {r['target']:g}×", "[green]yes[/]" if met else "[red]no[/]")
    console.print(rt)
    s = results.sanity
    h10, h10k = s[f"history/{SMALL}"], s[f"history/{LARGE}"]
    c10, c10k = s[f"context/{SMALL}"], s[f"context/{LARGE}"]
    status(
        f"replies: history 10-event {h10['events']} events, {h10['tokens']} tokens; {results.large}-event "
        f"{h10k['events']} events after checkpoint seq {h10k['checkpoint_seq']}, {h10k['tokens']} tokens with the "
        f"summary; context tokens {c10['tokens']['total']} / {c10k['tokens']['total']}."
    )


def write_json(path: Path, machine: dict, cfg: Config, mode: str, results: Results) -> None:
    data = {
        "benchmark": "query",
        "mode": mode,
        "machine": machine,
        "config": {
            **asdict(cfg),
            "concurrency": CONCURRENCY,
            "budget": BUDGET,
            "page_size": PAGE,
            "miss_method": "strategy.budget = 8000 + i, unique per request; Redis flushed before each row",
        },
        "seed": results.seed,
        "sanity": results.sanity,
        "echo": {"c64": asdict(results.echo_c64), "c1": asdict(results.echo_c1)},
        "echo_reply_as_large_as_history": {"c64": asdict(results.blob_c64), "c1": asdict(results.blob_c1)},
        "redis_lookup_alone": results.redis,
        "rows": [asdict(r) for r in results.rows],
        "sessions_list": results.lists,
        "client": results.clients,
        "interleaved": results.paired,
        "ratios": [{**r, "met": None if r["target"] is None else r["value"] <= r["target"]} for r in ratios(results)],
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    status(f"results written to {path}")


# --- main -----------------------------------------------------------------------------------


async def main(mode: str, json_path: Path | None, **sizes) -> int:
    """``sizes``: Config fields given on the command line (None: the mode's default)."""
    cfg = replace(MODES[mode], **{k: v for k, v in sizes.items() if v is not None})
    machine = machine_info()
    started = now()
    status(f"[bold]memq query benchmark[/] — {mode} run")
    warn_if_busy(machine)
    with tempfile.TemporaryDirectory(prefix="memq-bench-query-") as tmp:
        results = await run(cfg, machine, Path(tmp))
    print_results(machine, cfg, mode, results)
    machine["wall_s"] = round(now() - started, 1)
    status(f"total {machine['wall_s']:.0f} s")
    if json_path:
        write_json(json_path, machine, cfg, mode, results)
    errors = sum(r.c64.errors + r.c1.errors for r in results.rows)
    return 0 if errors == 0 else 1


def replica_counts(text: str) -> tuple[int, ...]:
    counts = tuple(sorted({int(n) for n in text.split(",")}))
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError("replica counts are positive integers, e.g. 1,2,4")
    return counts


def at_least(low: int):
    def parse(text: str) -> int:
        n = int(text)
        if n < low:
            raise argparse.ArgumentTypeError(f"at least {low}")
        return n

    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sized = parser.add_mutually_exclusive_group()
    sized.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    sized.add_argument(
        "--smoke", action="store_true", help="the smallest run, one worker (the smoke test's; its figures mean nothing)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument(
        "--replicas",
        type=replica_counts,
        metavar="N[,N…]",
        help="query worker processes, measured in turn (default 1,2); the baselines, sessions.list and the "
        "client rows run beside the smallest count",
    )
    parser.add_argument(
        "--events",
        type=at_least(KEEP_AFTER_CHECKPOINT + 2),
        dest="large_events",
        metavar="N",
        help="events in the large session (default 10,000)",
    )
    parser.add_argument(
        "--sessions",
        type=at_least(PAGE * 11),
        dest="list_sessions",
        metavar="N",
        help="sessions in the big sessions.list app (default 100,000; --quick 20,000)",
    )
    parser.add_argument(
        "--users",
        type=at_least(8),
        dest="list_users",
        metavar="N",
        help="users the big sessions.list app's sessions are spread over (default 1,000)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    sizes = dict(
        replicas=args.replicas,
        large_events=args.large_events,
        list_sessions=args.list_sessions,
        list_users=args.list_users,
    )
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sys.exit(asyncio.run(main(mode, args.json, **sizes)))
