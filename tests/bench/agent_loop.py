"""Agent-loop benchmark: the turn an agent runs all day, memq beside plain SQL and beside its design's floor.

Usage::

    .venv/bin/python tests/run_bench.py agent_loop [--quick] [--json PATH]
        [--agents 1,16,64] [--seconds S] [--rounds R] [--cache memory|redis]
        [--paths P,...] [--think-ms MS] [--gc-threshold N] [--gc-freeze] [--search]

Everything runs on loopback, on servers this script starts and stops itself
(``tests/services.py``): one nats-server, one PostgreSQL (and Redis with
``--cache redis``), one ``memq worker persistence`` and one ``memq worker
query`` process, started as a user would start them. No index: the turn asks
for no recall, so neither Weaviate nor an embedder is involved.

**The memq turn** (what ``MemoryClient.with_history`` does), each simulated
agent in a session of its own, one ``MemoryClient`` each on a shared NATS
connection:

1. append the user event (300 characters) and await its PubAck;
2. ``context(format="openai", recall_limit=0, min_seq=<that seq>)`` with
   read-your-writes: the reply must already hold the user event (``message=``
   is left out because the event is already stored: it would count twice);
3. append the assistant event (300 characters) and await its PubAck.

**The turn that costs one publish** (issue 43, :mod:`memq.contracts.local`):
the same turn with a client made with ``local_reads=LocalWindows()``, whose
appends are conditional on the window it holds and whose read after them (the
same context, its messages of plain strings) is answered in the client;
beside it runs today's carried turn ("memq carry"). The same with a
``history`` read (the app's strategy: "memq one-publish history", beside
"memq carry history"), and ADK's read (``get_session`` with the last 50
events, which carries nothing: it waits for the commit) both ways
("get_session", "get_session local"). ``--paths`` picks loops.

**The floor** (same run, same PostgreSQL, its own table): the same turn
written directly through asyncpg, a pool of one connection per agent: one
``INSERT`` committed (autocommit) and one ``SELECT`` of the session's last 50
rows. It does less than memq (no stream, no second append, no token counts,
no strategy), which is why it is the floor.

**The design's floor** (same run): the bare pipeline
(``tests/bench/bare_pipeline.py``), memq's hops without memq's work. The
turn goes client → JetStream → a persister process (one ``INSERT`` per
batch, ack, a notice) → an answerer process woken by the notice (one
``SELECT``) → client, then the assistant event to JetStream. Beside the
direct-SQL turn it says what the hops alone cost on this machine; beside
memq's turn, what memq's own work costs. And "bare tail": the same with an
answerer that does not wait for the commit (SQL plus the session's
uncommitted events, held from the stream), the floor of ``query.read_tail``.

For each number of concurrent agents A (1, 16, 64), the four loops run one
after the other for ``--seconds`` each, ``--rounds`` times, each loop
leading a round in turn, so a slow moment of a shared machine does not
favour one side. Turns/s and turn p50/p99 are over
every round; the memq rows also give the p50 of each step. With one agent
the context step is split in two: the wait for the commit (from the PubAck
to the persistence worker's ``memq.v1.committed`` notice naming the seq,
heard by this script as the query worker hears it) and the read after it.
Only then: the subscription costs client CPU, and the split is what matters
for one agent's latency. Turns run back to back unless ``--think-ms`` makes
each agent pause between them, as its LLM call would (the machine is then
idle between turns, and no commit of the last turn overlaps the next). Every memq reply
is checked: a context that lacks the user event just appended is counted as
a read-your-writes violation (and fails the run), as is any error.

**Python's garbage collector.** Every loop's client runs in this process,
so they share its collector: ``--gc-threshold N`` sets its first
generation's threshold (``gc.set_threshold(N, 10, 10)``; default Python's
700) for every loop alike, as an agent process with many concurrent
sessions may. The results count each loop's collections and the seconds
they took in this process (``gc.callbacks``): a read that hands the agent
hundreds of decoded events, held across its next await, makes objects that
outlive the first generation and trigger full collections of the whole heap.
That heap is this script's: it imports the test helpers, and with them the
workers' SQL stack, which makes a full collection take ~100 ms here, against
~5 ms in a process that imports only the client and ``LocalWindows``; an
agent's framework adds its own. ``--gc-freeze`` calls ``gc.freeze()`` once
the stack is up, as a process may after its start-up, so that collections
scan only what the loops make.

**What a turn costs the machine.** Around every loop the script reads the
CPU time of every process (``/proc/<pid>/stat``) and reports CPU ms per turn
by process: this script (the client of both loops), each worker, nats-server,
PostgreSQL's backends and the rest of the machine. On a machine with few
cores, turns/s at many agents is bounded by cores ÷ CPU per turn.

**Search after an append** (``--search``, instead of the loops above):
what a search that sees the caller's own write costs (issue 26). The stack
adds a ``memq worker indexing`` process (the local ONNX embedder and the
embedded index, as ``memq up`` runs them). Each turn appends a user event
holding a word no other event has, then at once searches (hybrid, k 5) the
agent's own user for that word, two ways side by side, alternating as
above: "search wait" (the default: the search carries the append's
sequence and is answered once it is indexed) and "search no wait"
(``min_seq=0``: what is indexed now). A wait search that misses its event
is a read-your-writes violation (and fails the run); the no-wait loop
counts its misses. With one agent the wait's search step is split in two:
until the indexing worker's ``memq.v1.committed.memq-indexing`` notice
names the sequence, and the read after it.

Targets (issue 13), from numbers of this run: with 1 agent, memq's turn p50
≤ 2× the direct-SQL turn's; with 64 agents, memq's turns/s ≥ direct SQL's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg
import helpers
import nats
import services
from rich.table import Table

from bench import bare_pipeline
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
from bench.query import Proc
from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError
from memq.contracts.subjects import EVENTS_STREAM
from memq.workers.memory.local import LocalWindows

APP = "agents"
EVENT_CHARS = 300
LAST_N = 50
MEMQ = Path(sys.prefix) / "bin" / "memq"
now = time.perf_counter

FLOOR_SCHEMA = bare_pipeline.turns_table("agent_turns", "bigint GENERATED ALWAYS AS IDENTITY")
FLOOR_INSERT = "INSERT INTO agent_turns (session_id, role, data, created_at) VALUES ($1, $2, $3, $4) RETURNING seq"
FLOOR_SELECT = "SELECT seq, role, data FROM agent_turns WHERE session_id = $1 ORDER BY seq DESC LIMIT 50"


# memq's turns: the read waits for the commit of the caller's append ("wait",
# before carried writes), also for every other writer's acknowledged writes
# ("any"), or carries the append and does not wait for it ("carry", the default).
MEMQ_READS = {"memq": "wait", "memq any": "any", "memq carry": "carry"}
# The turn that costs one publish (issue 43, memq.contracts.local): the read
# after the append is the turn's context (as "memq carry" reads it), a history
# (the app's strategy) or ADK's read (get_session, the last 50 events), each
# today (a request: context and history carried, get_session waiting for the
# commit) and answered in the client.
LOCAL_READS = {
    "memq one-publish": "context local",
    "memq carry history": "history",
    "memq one-publish history": "history local",
    "get_session": "get_session",
    "get_session local": "get_session local",
}
PATHS = (*MEMQ_READS, *LOCAL_READS, "sql", "bare", "bare tail")


@dataclass(frozen=True)
class Config:
    agents: tuple[int, ...]
    seconds: float  # each loop, each round
    rounds: int
    cache: str  # the query worker's cache backend: memory or redis
    think_ms: float = 0.0  # each agent's pause between turns (its LLM call)
    search: bool = False  # the search loops instead of the turn loops
    paths: tuple[str, ...] = PATHS  # the turn loops to run
    gc_threshold: int = 700  # this process's first-generation GC threshold (Python's default: 700)
    gc_freeze: bool = False  # gc.freeze() the heap built before the loops


@dataclass
class Run:
    """One loop (memq or sql) at one number of agents, over every round."""

    path: str
    agents: int
    turns: int = 0
    seconds: float = 0.0
    turn_ms: list[float] = field(default_factory=list)
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    ryw_violations: int = 0
    missed: int = 0  # searches that did not find the event just appended (search no wait)
    first_error: str | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU the machine spent on this loop, by process
    gc: dict[str, list[float]] = field(default_factory=dict)  # generation → [collections, seconds] in this process

    def record(self, turn_ms: float, steps: dict[str, float] | None = None) -> None:
        self.turns += 1
        self.turn_ms.append(turn_ms)
        for name, ms in (steps or {}).items():
            self.step_ms.setdefault(name, []).append(ms)

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"

    @property
    def per_s(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    def spent(self, cpu: dict[str, float]) -> None:
        for who, seconds in cpu.items():
            self.cpu_s[who] = self.cpu_s.get(who, 0.0) + seconds

    def cpu_ms_per_turn(self) -> dict[str, float]:
        """What one turn costs the machine, by process, and in all."""
        per = {who: round(s * 1000 / max(self.turns, 1), 3) for who, s in sorted(self.cpu_s.items())}
        return per | {"total": round(sum(self.cpu_s.values()) * 1000 / max(self.turns, 1), 3)}

    def summary(self) -> dict:
        return dict(
            path=self.path,
            agents=self.agents,
            turns=self.turns,
            turns_per_s=round(self.per_s, 1),
            p50_ms=round(percentile(self.turn_ms, 50), 3),
            p99_ms=round(percentile(self.turn_ms, 99), 3),
            steps_p50_ms={k: round(percentile(v, 50), 3) for k, v in self.step_ms.items()},
            cpu_ms_per_turn=self.cpu_ms_per_turn(),
            errors=self.errors,
            ryw_violations=self.ryw_violations,
            missed=self.missed,
            first_error=self.first_error,
            gc=self.gc_per_turn(),
        )

    def gc_per_turn(self) -> dict[str, float]:
        """This process's collections per 1,000 turns and their ms per turn: the full ones (generation 2) and all."""
        turns = max(self.turns, 1)
        full = self.gc.get("2", [0, 0.0])
        return {
            "full_per_1000_turns": round(full[0] * 1000 / turns, 2),
            "full_ms_per_turn": round(full[1] * 1000 / turns, 4),
            "all_ms_per_turn": round(sum(t[1] for t in self.gc.values()) * 1000 / turns, 4),
        }


def text_of(role: str, agent: int, turn: int) -> str:
    head = f"{role} {agent}.{turn}: "
    return head + ("lorem ipsum dolor sit amet " * 12)[: EVENT_CHARS - len(head)]


# --- the loops --------------------------------------------------------------------------


async def run_agents(n: int, seconds: float, turn, think_s: float = 0.0) -> float:
    """Run ``turn(agent, i)`` in ``n`` concurrent loops for ``seconds``,
    each pausing ``think_s`` after a turn; the wall time until the last loop
    finished its last turn."""
    stop_at = now() + seconds

    async def loop(agent: int) -> None:
        i = 0
        while now() < stop_at:
            await turn(agent, i)
            i += 1
            if think_s:
                await asyncio.sleep(think_s)

    started = now()
    await asyncio.gather(*(loop(a) for a in range(n)))
    return now() - started


def said_last(read: str, reply) -> str | None:
    """The text of the newest message a read's reply holds."""
    if read.startswith(("history", "get_session")):
        events = reply.events or ()
        return events[-1].event["message"]["parts"][0]["text"] if events else None
    return reply.messages[-1].get("content") if reply.messages else None


class MemqLoop:
    def __init__(self, nc, n: int, tag: str, clock: CommitClock | None = None, read: str = "wait"):
        self.clients = [
            MemoryClient(
                nc,
                APP,
                carry_writes=read in ("carry", "history"),
                consistency="any" if read == "any" else "own",
                local_reads=LocalWindows() if read.endswith("local") else None,
            )
            for _ in range(n)
        ]
        self.sessions = [(f"user-{a % 16}", f"{tag}-agent-{a}") for a in range(n)]
        self.clock = clock
        self.read = read

    async def _read(self, client: MemoryClient, user: str, session: str):
        # min_seq by default: this client's last write, seq (an explicit one is never carried)
        if self.read.startswith("history"):
            return await client.history(user, session)
        if self.read.startswith("get_session"):
            return await client.get_session(user, session, num_recent_events=LAST_N)
        return await client.context(user, session, format="openai", recall_limit=0)

    async def turn(self, run: Run, agent: int, i: int) -> None:
        client, (user, session) = self.clients[agent], self.sessions[agent]
        said = text_of("user", agent, i)
        t0 = now()
        try:
            seq = await client.append_text(user, session, "user", said)
            t1 = now()
            reply = await self._read(client, user, session)
            t2 = now()
            await client.append_text(user, session, "assistant", text_of("assistant", agent, i))
            t3 = now()
        except (MemqError, nats.errors.Error, TimeoutError) as exc:
            run.failed(exc)
            return
        if said_last(self.read, reply) != said:
            run.ryw_violations += 1
        read = "context" if self.read in MEMQ_READS.values() else self.read.split()[0]
        steps = {"append user": (t1 - t0) * 1000, read: (t2 - t1) * 1000}
        if self.clock is not None and (committed := self.clock.at.pop(seq, None)) is not None:
            # clamped: the notice may come before the PubAck is read, or
            # (read from a cache no commit had to wait for) after the reply
            heard = min(max(committed, t1), t2)
            steps["of which: commit"] = (heard - t1) * 1000
            steps["of which: read after it"] = (t2 - heard) * 1000
        steps["append assistant"] = (t3 - t2) * 1000
        run.record((t3 - t0) * 1000, steps)


class SqlLoop:
    def __init__(self, pool: asyncpg.Pool, tag: str):
        self.pool = pool
        self.tag = tag

    async def turn(self, run: Run, agent: int, i: int) -> None:
        session = f"{self.tag}-agent-{agent}"
        said = text_of("user", agent, i)
        body = json.dumps({"role": "user", "content": said})
        t0 = now()
        try:
            async with self.pool.acquire() as conn:
                seq = await conn.fetchval(FLOOR_INSERT, session, "user", body, time.time())
                rows = await conn.fetch(FLOOR_SELECT, session)
        except (asyncpg.PostgresError, OSError) as exc:
            run.failed(exc)
            return
        if not rows or rows[0]["seq"] != seq:
            run.ryw_violations += 1
        run.record((now() - t0) * 1000)


class BareLoop:
    """memq's hops without memq's work (:mod:`bare_pipeline`): what the design
    costs on this machine before any of memq's code runs."""

    def __init__(self, nc, tag: str, variant: str = "wait"):
        self.client = bare_pipeline.BareClient(nc, variant)
        self.tag = tag

    async def turn(self, run: Run, agent: int, i: int) -> None:
        session = f"{self.tag}-agent-{agent}"
        said = text_of("user", agent, i)
        t0 = now()
        try:
            seq = await self.client.append(session, "user", said, f"{session}-{i}-u")
            rows = await self.client.last_50(session, seq)
            await self.client.append(session, "assistant", text_of("assistant", agent, i), f"{session}-{i}-a")
        except (nats.errors.Error, TimeoutError) as exc:
            run.failed(exc)
            return
        if not rows or rows[0][0] != seq or json.loads(rows[0][2])["content"] != said:
            run.ryw_violations += 1
        run.record((now() - t0) * 1000)


class SearchLoop:
    """Append an event with a word of its own, then search for it, with the
    wait (``min_seq`` default: the append) or without (``min_seq=0``)."""

    def __init__(self, nc, n: int, tag: str, wait: bool, clock: CommitClock | None = None):
        self.clients = [MemoryClient(nc, APP) for _ in range(n)]
        self.users = [f"{tag}-user-{a}" for a in range(n)]
        self.wait = wait
        self.clock = clock

    async def turn(self, run: Run, agent: int, i: int) -> None:
        client, user = self.clients[agent], self.users[agent]
        word = f"zq{uuid.uuid4().hex[:10]}"
        t0 = now()
        try:
            seq = await client.append_text(user, "s", "user", f"turn {i}: the code word is {word}")
            t1 = now()
            found = await client.search(user, word, k=5, min_seq=None if self.wait else 0)
            t2 = now()
        except (MemqError, nats.errors.Error, TimeoutError) as exc:
            run.failed(exc)
            return
        if not any(word in hit.content for hit in found.results):
            if self.wait:
                run.ryw_violations += 1
            else:
                run.missed += 1
        steps = {"append": (t1 - t0) * 1000, "search": (t2 - t1) * 1000}
        if self.clock is not None and (indexed := self.clock.at.pop(seq, None)) is not None:
            heard = min(max(indexed, t1), t2)
            steps["of which: indexing"] = (heard - t1) * 1000
            steps["of which: read after it"] = (t2 - heard) * 1000
        run.record((t2 - t0) * 1000, steps)


# The durable consumers that commit the turns: memq's persistence worker and
# the bare persister.
COMMITTERS = ((EVENTS_STREAM, "memq-persistence"), (bare_pipeline.STREAM, bare_pipeline.DURABLE))


async def committed_all(js, timeout: float = 120.0) -> None:
    """Wait until every committer has committed all it was given. A turn that
    does not wait for its commit (one publish, carried reads, bare tail) can
    end its loop with commits still to run: they are that loop's work, not
    the next one's."""
    deadline = now() + timeout
    for stream, durable in COMMITTERS:
        try:
            info = await js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            continue  # the search loops start no bare pipeline
        while info.num_pending or info.num_ack_pending:
            if now() > deadline:
                raise TimeoutError(f"{durable} still had {info.num_pending + info.num_ack_pending} to commit")
            await asyncio.sleep(0.005)
            info = await js.consumer_info(stream, durable)


@contextmanager
def collections_into(into: dict[str, list[float]]):
    """Count this process's garbage collections, and the seconds they take,
    into ``into`` (generation → [collections, seconds]) while the block runs."""
    started = [0.0]

    def heard(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            tally = into.setdefault(str(info["generation"]), [0, 0.0])
            tally[0] += 1
            tally[1] += time.perf_counter() - started[0]

    gc.callbacks.append(heard)
    try:
        yield
    finally:
        gc.callbacks.remove(heard)


async def one_round(cfg: Config, js, n: int, r: int, order: list, label, clock: CommitClock | None) -> None:
    """Round ``r``: a warm-up turn of each loop (sessions exist, connections
    are open), then each loop for ``cfg.seconds``, loop ``r`` leading, so a
    slow moment of a shared machine does not favour one side. A loop ends
    when its turns are committed (:func:`committed_all`): the CPU it cost the
    machine until then goes to its run, and so does that time (turns/s is
    what the machine sustains, commits included)."""
    await committed_all(js)
    for _, loop in order:
        await asyncio.gather(*(loop.turn(Run("warm", n), a, -1) for a in range(n)))
    lead = r % len(order)
    for run, loop in order[lead:] + order[:lead]:

        async def turn(agent: int, i: int, run: Run = run, loop=loop) -> None:
            await loop.turn(run, agent, i)

        if clock is not None:
            clock.reset()
        before, started = process_cpu(), now()
        with collections_into(run.gc):
            await run_agents(n, cfg.seconds, turn, cfg.think_ms / 1000)
            await committed_all(js)
        run.seconds += now() - started
        run.spent(cpu_between(before, process_cpu(), label))


async def measure_search(cfg: Config, nc, label, clock: CommitClock | None) -> list[Run]:
    """The two search loops at each number of agents, alternating as measure() does."""
    runs: list[Run] = []
    for n in cfg.agents:
        wait_run, fast_run = Run("search wait", n), Run("search no wait", n)
        status(f"[bold]{n} agent{'s' if n > 1 else ''}[/]: {cfg.rounds} rounds of {cfg.seconds:g} s per loop")
        for r in range(cfg.rounds):
            tag = f"a{n}r{r}-{uuid.uuid4().hex[:6]}"
            wait_loop = SearchLoop(nc, n, tag, True, clock if n == 1 else None)
            fast_loop = SearchLoop(nc, n, f"{tag}-f", False)
            await one_round(cfg, nc.jetstream(), n, r, [(wait_run, wait_loop), (fast_run, fast_loop)], label, clock)
            status(
                f"  round {r + 1}: wait {wait_run.per_s:,.0f} turns/s p50 {percentile(wait_run.turn_ms, 50):.2f} ms"
                f" · no wait {fast_run.per_s:,.0f} turns/s p50 {percentile(fast_run.turn_ms, 50):.2f} ms,"
                f" missed {fast_run.missed} of {fast_run.turns}"
            )
        runs += [wait_run, fast_run]
    return runs


async def measure(cfg: Config, nc, pool: asyncpg.Pool, label, clock: CommitClock | None) -> list[Run]:
    """Every loop at each number of agents; ``label(pid, name)`` names the
    process a pid is, for the CPU each loop costs the machine; ``clock``
    splits the one-agent context step."""
    runs: list[Run] = []
    if cfg.gc_freeze:  # what an agent process may do once it has started (see the module's docstring)
        gc.collect()
        gc.freeze()
    for n in cfg.agents:
        paths = [p for p in PATHS if p in cfg.paths]
        by = {path: Run(path, n) for path in paths}
        status(f"[bold]{n} agent{'s' if n > 1 else ''}[/]: {cfg.rounds} rounds of {cfg.seconds:g} s per loop")
        for r in range(cfg.rounds):
            tag = f"a{n}r{r}-{uuid.uuid4().hex[:6]}"
            loops: dict = {
                path: MemqLoop(nc, n, f"{tag}-{read}", clock if n == 1 and read == "wait" else None, read)
                for path, read in (MEMQ_READS | LOCAL_READS).items()
            }
            loops |= {
                "sql": SqlLoop(pool, tag),
                "bare": BareLoop(nc, tag),
                "bare tail": BareLoop(nc, f"{tag}-t", "tail"),
            }
            await one_round(cfg, nc.jetstream(), n, r, [(by[path], loops[path]) for path in paths], label, clock)
            status(
                f"  round {r + 1}: "
                + " · ".join(
                    f"{path} {run.per_s:,.0f} turns/s p50 {percentile(run.turn_ms, 50):.2f} ms"
                    for path, run in by.items()
                )
            )
        runs += by.values()
    return runs


# --- the stack --------------------------------------------------------------------------


def worker_env(nats_url: str, db_url: str, redis_url: str | None, work: Path) -> dict[str, str]:
    env = helpers.settings_env(helpers.make_settings(nats_url, db_url, work))
    env["MEMQ_DATABASE__MIGRATE_ON_START"] = "false"  # migrated once, before the workers start
    if redis_url:
        env.update(MEMQ_CACHE__BACKEND="redis", MEMQ_CACHE__REDIS_URL=redis_url)
    else:
        env["MEMQ_CACHE__BACKEND"] = "memory"
    return env


async def wait_until_answering(nc, workers: list[Proc], timeout: float = 60.0) -> None:
    """Until a context request gets a reply (NotFound is a reply: the worker is up)."""
    client = MemoryClient(nc, APP, timeout=1.0)
    deadline = now() + timeout
    while True:
        for w in workers:
            w.check_alive()
        try:
            await client.context("nobody", "nothing", recall_limit=0)
            return
        except MemqError as exc:
            if exc.code == "not_found":
                return
            if now() > deadline:
                raise
        await asyncio.sleep(0.2)


async def wait_until_bare_answers(nc, procs: list[Proc], timeout: float = 30.0) -> None:
    deadline = now() + timeout
    for variant in bare_pipeline.VARIANTS:
        client = bare_pipeline.BareClient(nc, variant)
        while True:
            for p in procs:
                p.check_alive()
            try:
                await client.last_50("nobody", 0)
                break
            except (nats.errors.NoRespondersError, TimeoutError):
                if now() > deadline:
                    raise
            await asyncio.sleep(0.2)


async def run(cfg: Config, machine: dict, work: Path) -> list[Run]:
    async with AsyncExitStack() as stack:
        status("starting nats-server, PostgreSQL" + (", Redis" if cfg.cache == "redis" else "") + " …")
        nats_server = stack.enter_context(services.NatsServer())
        pg = stack.enter_context(services.Postgres())
        redis_url = stack.enter_context(services.Redis()).url if cfg.cache == "redis" else None
        machine["postgres"] = pg.psql("SHOW server_version").strip()
        db_url = pg.create_database("bench_agents")
        engine = await helpers.migrated_engine(db_url)
        await engine.dispose()
        env = worker_env(nats_server.url, db_url, redis_url, work)
        procs = [
            Proc([str(MEMQ), "worker", kind], env, work / f"{kind}.log").start() for kind in ("persistence", "query")
        ]
        names = {p.pid: p.cmd[-1] for p in procs}
        nc = await nats.connect(nats_server.url, name="bench-agent-loop")
        stack.push_async_callback(nc.close)
        await bare_pipeline.prepare(nc, pg.dsn("bench_agents"))
        for role in ("persist", "answer", "answer-from-tail"):
            bare = [sys.executable, bare_pipeline.__file__, role, nats_server.url, pg.dsn("bench_agents")]
            procs.append(Proc(bare, env, work / f"bare-{role}.log").start())
            names[procs[-1].pid] = f"bare {role}"

        async def stop_all() -> None:
            await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))

        stack.push_async_callback(stop_all)
        pool = await asyncpg.create_pool(pg.dsn("bench_agents"), min_size=1, max_size=max(cfg.agents))
        stack.push_async_callback(pool.close)
        async with pool.acquire() as conn:
            await conn.execute(FLOOR_SCHEMA)
        try:
            await helpers.wait_for_consumer(nats_server.url)
            await wait_until_answering(nc, procs)
            await wait_until_bare_answers(nc, procs)
            clock = None
            if 1 in cfg.agents:  # only there: hearing every notice costs the client CPU
                clock = CommitClock()
                await clock.start(nc)
            return await measure(cfg, nc, pool, process_label(names), clock)
        except BaseException:
            for p in procs:
                console.print(f"[red]{' '.join(p.cmd[-2:])} log:[/]\n{p.log_tail()}")
            raise


async def run_search(cfg: Config, machine: dict, work: Path) -> list[Run]:
    """The search loops on nats-server, PostgreSQL and the persistence,
    query and indexing workers (local embedder, embedded index)."""
    async with AsyncExitStack() as stack:
        status("starting nats-server, PostgreSQL …")
        nats_server = stack.enter_context(services.NatsServer())
        pg = stack.enter_context(services.Postgres())
        machine["postgres"] = pg.psql("SHOW server_version").strip()
        db_url = pg.create_database("bench_agents")
        engine = await helpers.migrated_engine(db_url)
        await engine.dispose()
        env = worker_env(nats_server.url, db_url, None, work)
        kinds = ("persistence", "query", "indexing")
        procs = [Proc([str(MEMQ), "worker", kind], env, work / f"{kind}.log").start() for kind in kinds]
        names = {p.pid: p.cmd[-1] for p in procs}
        nc = await nats.connect(nats_server.url, name="bench-agent-loop")
        stack.push_async_callback(nc.close)

        async def stop_all() -> None:
            await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))

        stack.push_async_callback(stop_all)
        try:
            await helpers.wait_for_consumer(nats_server.url)
            await wait_until_answering(nc, procs)
            status("waiting for the indexing worker (loading the model) …")
            await helpers.wait_for_consumer(nats_server.url, "memq-indexing", timeout=180)
            # The query worker loads its embedder on the first search.
            await MemoryClient(nc, APP, timeout=120).search("nobody", "warm up")
            clock = None
            if 1 in cfg.agents:
                clock = CommitClock("memq-indexing")
                await clock.start(nc)
            return await measure_search(cfg, nc, process_label(names), clock)
        except BaseException:
            for p in procs:
                console.print(f"[red]{' '.join(p.cmd[-2:])} log:[/]\n{p.log_tail()}")
            raise


# --- output ------------------------------------------------------------------------------


def targets(runs: list[Run]) -> list[dict]:
    by = {(r.path, r.agents): r for r in runs}
    out = []
    for path in MEMQ_READS:
        if (path, 1) in by and ("sql", 1) in by:
            ratio = percentile(by[path, 1].turn_ms, 50) / percentile(by["sql", 1].turn_ms, 50)
            what = f"1 agent: {path} turn p50 ÷ direct-SQL turn p50"
            out.append(dict(what=what, value=ratio, target="≤ 2", ok=ratio <= 2))
        if (path, 64) in by and ("sql", 64) in by:
            ratio = by[path, 64].per_s / by["sql", 64].per_s
            what = f"64 agents: {path} turns/s ÷ direct-SQL turns/s"
            out.append(dict(what=what, value=ratio, target="≥ 1", ok=ratio >= 1))
    # issue 43: the one-publish turn
    if ("memq one-publish", 1) in by and ("sql", 1) in by:
        ratio = percentile(by["memq one-publish", 1].turn_ms, 50) / percentile(by["sql", 1].turn_ms, 50)
        what = "1 agent: memq one-publish turn p50 ÷ direct-SQL turn p50"
        out.append(dict(what=what, value=ratio, target="≤ 1.5", ok=ratio <= 1.5))
    if ("memq one-publish", 64) in by and ("bare", 64) in by:
        mine, bare = by["memq one-publish", 64], by["bare", 64]
        ratio = mine.per_s / bare.per_s
        what = "64 agents: memq one-publish turns/s ÷ bare pipeline turns/s"
        out.append(dict(what=what, value=ratio, target="≥ 0.8", ok=ratio >= 0.8))
        ratio = mine.cpu_ms_per_turn()["total"] / bare.cpu_ms_per_turn()["total"]
        what = "64 agents: memq one-publish CPU per turn ÷ bare pipeline's"
        out.append(dict(what=what, value=ratio, target="≤ 1.5", ok=ratio <= 1.5))
    return out


def local_ratios(runs: list[Run]) -> list[dict]:
    """The one-publish turn and ADK's read, each beside itself as a request,
    direct SQL and the bare pipeline, at each number of agents (p50, CPU per turn)."""
    by = {(r.path, r.agents): r for r in runs}
    out = []
    pairs = [
        ("memq one-publish", "memq carry"),
        ("memq one-publish history", "memq carry history"),
        ("memq one-publish", "sql"),
        ("memq one-publish", "bare"),
        ("get_session local", "get_session"),
        ("get_session local", "sql"),
    ]
    for n in sorted({r.agents for r in runs}):
        for a, b in pairs:
            if (a, n) in by and (b, n) in by:
                ra, rb = by[a, n], by[b, n]
                out.append(
                    dict(
                        agents=n,
                        what=f"{a} ÷ {b}",
                        p50=round(percentile(ra.turn_ms, 50) / percentile(rb.turn_ms, 50), 2),
                        per_s=round(ra.per_s / rb.per_s, 2) if rb.per_s else None,
                        cpu_per_turn=round(ra.cpu_ms_per_turn()["total"] / rb.cpu_ms_per_turn()["total"], 2),
                    )
                )
    return out


def floor(runs: list[Run]) -> list[dict]:
    """Where memq's turn stands between its design's floor (the bare
    pipeline) and direct SQL, at each number of agents: no targets, the
    reading of the targets'."""
    by = {(r.path, r.agents): r for r in runs}
    out = []
    for n in sorted({r.agents for r in runs}):
        paths = (*MEMQ_READS, "sql", "bare", "bare tail")
        if not all((p, n) in by for p in paths):
            continue
        p50 = {p: percentile(by[p, n].turn_ms, 50) for p in paths}
        row: dict = dict(
            agents=n,
            bare_p50_over_sql=round(p50["bare"] / p50["sql"], 2),
            bare_tail_p50_over_sql=round(p50["bare tail"] / p50["sql"], 2),
            bare_per_s_over_sql=round(by["bare", n].per_s / by["sql", n].per_s, 2),
            bare_tail_per_s_over_sql=round(by["bare tail", n].per_s / by["sql", n].per_s, 2),
        )
        for path in MEMQ_READS:
            name = path.replace(" ", "_")
            row[f"{name}_p50_over_sql"] = round(p50[path] / p50["sql"], 2)
            row[f"{name}_p50_over_bare"] = round(p50[path] / p50["bare"], 2)
            row[f"{name}_per_s_over_bare"] = round(by[path, n].per_s / by["bare", n].per_s, 2)
        out.append(row)
    return out


def print_results(machine: dict, cfg: Config, runs: list[Run]) -> None:
    status(
        f"\n[bold]agent loop[/] — {machine['nproc']} cores ({machine['cpu']}), PostgreSQL {machine.get('postgres', '?')}, "
        f"commit {machine['git']}, cache {cfg.cache}, {cfg.rounds} × {cfg.seconds:g} s per loop, "
        f"GC threshold {cfg.gc_threshold}{', startup heap frozen' if cfg.gc_freeze else ''}"
    )
    searched = any(r.path.startswith("search") for r in runs)
    table = Table("agents", "path", "turns/s", "p50 ms", "p99 ms", "steps p50 ms", "errors", "ryw violations")
    if searched:
        table.add_column("searches missed")
    for r in runs:
        s = r.summary()
        steps = " · ".join(f"{k} {v:.2f}" for k, v in s["steps_p50_ms"].items())
        table.add_row(
            str(r.agents),
            r.path,
            f"{s['turns_per_s']:,.0f}",
            f"{s['p50_ms']:.2f}",
            f"{s['p99_ms']:.2f}",
            steps,
            str(r.errors),
            str(r.ryw_violations),
            *([f"{r.missed} of {r.turns}"] if searched else []),
        )
    console.print(table)
    who = sorted({k for r in runs for k in r.cpu_s}, key=lambda k: (k == "other", k))
    cpu = Table(
        "agents",
        "path",
        *who,
        "total",
        "of the client: GC",
        "full GCs / 1k turns",
        title="CPU per turn, ms (all processes of the machine)",
    )
    for r in runs:
        per, collected = r.cpu_ms_per_turn(), r.gc_per_turn()
        cpu.add_row(
            str(r.agents),
            r.path,
            *(f"{per.get(k, 0):.3f}" for k in who),
            f"{per['total']:.3f}",
            f"{collected['all_ms_per_turn']:.3f}",
            f"{collected['full_per_1000_turns']:.1f}",
        )
    console.print(cpu)
    for f in floor(runs):
        status(
            f"{f['agents']} agent{'s' if f['agents'] > 1 else ''}: p50 ÷ direct SQL: bare {f['bare_p50_over_sql']:.2f}, "
            f"bare tail {f['bare_tail_p50_over_sql']:.2f}, "
            + ", ".join(f"{p} {f[p.replace(' ', '_') + '_p50_over_sql']:.2f}" for p in MEMQ_READS)
            + "; ÷ bare: "
            + ", ".join(f"{p} {f[p.replace(' ', '_') + '_p50_over_bare']:.2f}" for p in MEMQ_READS)
            + f". Turns/s ÷ direct SQL: bare {f['bare_per_s_over_sql']:.2f}, bare tail {f['bare_tail_per_s_over_sql']:.2f}; "
            + "÷ bare: "
            + ", ".join(f"{p} {f[p.replace(' ', '_') + '_per_s_over_bare']:.2f}" for p in MEMQ_READS)
        )
    for r in local_ratios(runs):
        status(
            f"{r['agents']} agent{'s' if r['agents'] > 1 else ''}: {r['what']}: p50 {r['p50']:.2f}, "
            f"turns/s {r['per_s']}, CPU per turn {r['cpu_per_turn']:.2f}"
        )
    for t in targets(runs):
        mark = "[green]met[/]" if t["ok"] else "[red]not met[/]"
        status(f"{t['what']}: {t['value']:.2f} (target {t['target']}) {mark}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run: 1 round of 2 s per loop")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--agents", default="1,16,64", help="numbers of concurrent agents (default 1,16,64)")
    parser.add_argument("--seconds", type=float, help="each loop, each round (default 5; --quick 2)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3; --quick 1)")
    parser.add_argument("--cache", choices=("memory", "redis"), default="memory", help="the query worker's cache")
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"the turn loops to run, comma-separated (default all: {', '.join(PATHS)})",
    )
    parser.add_argument(
        "--search",
        action="store_true",
        help="instead of the turn loops: append then search for it, with the wait for its indexing "
        "(search's default) and without (min_seq=0), side by side; adds an indexing worker",
    )
    parser.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        help="each agent's pause between turns, as its LLM call (default 0: turns back to back, "
        "so one turn's commits overlap the next; turns/s then counts the pauses too)",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=700,
        metavar="N",
        help="this process's first-generation GC threshold, for every loop alike (default 700, Python's)",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() this process's heap once the stack is up, before the loops (default: not)",
    )
    return parser.parse_args()


async def main(args: argparse.Namespace) -> int:
    cfg = Config(
        agents=tuple(int(a) for a in args.agents.split(",")),
        seconds=args.seconds or (2.0 if args.quick else 5.0),
        rounds=args.rounds or (1 if args.quick else 3),
        cache=args.cache,
        think_ms=args.think_ms,
        search=args.search,
        paths=tuple(p.strip() for p in args.paths.split(",")),
        gc_threshold=args.gc_threshold,
        gc_freeze=args.gc_freeze,
    )
    gc.set_threshold(cfg.gc_threshold, 10, 10)
    if unknown := set(cfg.paths) - set(PATHS):
        raise SystemExit(f"unknown --paths: {', '.join(sorted(unknown))} (known: {', '.join(PATHS)})")
    machine = machine_info()
    status(f"[bold]memq agent-loop benchmark[/] — {'quick' if args.quick else 'full'} run")
    warn_if_busy(machine)
    with tempfile.TemporaryDirectory(prefix="memq-bench-agents-") as tmp:
        runs = await (run_search if cfg.search else run)(cfg, machine, Path(tmp))
    print_results(machine, cfg, runs)
    if args.json:
        body = dict(
            machine=machine,
            config=asdict(cfg),
            runs=[r.summary() for r in runs],
            targets=targets(runs),
            floor=floor(runs),
            local=local_ratios(runs),
        )
        args.json.write_text(json.dumps(body, indent=2))
        status(f"wrote {args.json}")
    bad = sum(r.errors + r.ryw_violations for r in runs)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("MEMQ_LOG_LEVEL", "WARNING")
    sys.exit(asyncio.run(main(parse_args())))
