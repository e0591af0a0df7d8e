"""One fault under steady load, start to finish.

:func:`run_fault` starts the load and the prober, lets them run for
``warmup_s``, applies the fault (``kill``), waits ``down_s``, repairs it
(``restore``), lets the load run ``after_s`` more, stops the load, waits
until every consumer has caught up, asks every session once more (each op
must answer correctly again: the system recovered), then checks SQL and the
index. :meth:`Report.assert_ok` fails on any wrong answer, any untyped or
internal error, a query still failing ``Timing.recover_s`` after the repair,
any lost or duplicated event and any index divergence.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from contention import CpuContention
from helpers import wait_for

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotFound
from memq.workers.sql.engine import create_engine

from .checks import SqlReport, check_sql, checkpoint_problems, converge_index, settle
from .load import Ledger, LoadDriver
from .probe import Prober
from .stack import Stack

Action = Callable[[], Awaitable[None] | None]


@dataclass
class Fault:
    """``kill`` takes a component away (SIGKILL); ``restore`` brings it back."""

    name: str
    kill: Action
    restore: Action


@dataclass(frozen=True)
class Timing:
    warmup_s: float = 4.0
    down_s: float = 4.0
    after_s: float = 8.0
    # After the repair, every probe started later than this, times the CPU
    # contention factor from the repair on (tests/contention.py), must be answered correctly:
    # catching up (embedding a backlog, replaying) is CPU work that other
    # processes on the machine slow down, as they would on a user's.
    recover_s: float = 5.0


WORKERS_READY_S = 180.0  # a worker that has not started by then is stuck (the tests' timeout is 240 s)
SLOW_APPEND_S = 1.0  # an append that waited longer for its ack was held up by the fault
RECORD_ENV = "MEMQ_FAULT_RECORD"  # a file: each report's figures() appended as a JSON line (tests/bench/recovery.py)


@dataclass
class Report:
    fault: str
    ledger: Ledger
    prober: Prober
    driver: LoadDriver
    sql: SqlReport
    timing: Timing = Timing()
    settle_s: float = 0.0
    recovery_s: float = 0.0  # from the repair to the start of the last probe not answered correctly
    after_repair: Counter[str] = field(default_factory=Counter)  # probes started after it, not correct
    index_docs: int | None = None
    checkpoints: int | None = None
    problems: list[str] = field(default_factory=list)
    killed: float = 0.0  # monotonic
    repaired: float = 0.0  # monotonic
    contention: float = 1.0  # runnable tasks per core from the repair on (at least 1)

    @property
    def allowed_recover_s(self) -> float:
        return self.timing.recover_s * self.contention

    def figures(self) -> dict[str, float | int | str]:
        """What a user saw, in seconds: how long queries failed after the kill
        and after the repair, and how long an append waited for its ack."""
        last_failure = self.prober.last_failure()
        waits = [(s.acked_at - s.started, s.acked_at) for s in self.ledger.all_acked() if s.acked_at is not None]
        slow = [acked for wait, acked in waits if wait > SLOW_APPEND_S]
        return {
            "fault": self.fault,
            "down_s": round(self.repaired - self.killed, 2),
            "queries_failed_from_kill_s": round(max(0.0, last_failure - self.killed), 2),
            "queries_failed_after_repair_s": round(self.recovery_s, 2),
            "failed_probes": sum(n for (_, outcome), n in self.prober.counts.items() if outcome != "correct"),
            "probes": sum(self.prober.counts.values()),
            "append_max_wait_s": round(max((w for w, _ in waits), default=0.0), 2),
            "appends_slow_after_repair_s": round(max(0.0, max(slow, default=0.0) - self.repaired), 2),
            "settle_s": round(self.settle_s, 2),
            "contention": round(self.contention, 2),
            "failed_after_repair": dict(self.after_repair),  # "op outcome" -> probes
        }

    def summary(self) -> str:
        lines = [
            f"== fault: {self.fault}",
            (
                f"published {len(self.ledger.sent)}, acked {self.sql.acked}, given up {self.ledger.given_up}, "
                f"publish errors {self.driver.publish_errors or 0}"
            ),
            f"SQL rows {self.sql.rows} (ack lost but stored once: {self.sql.ack_lost_but_stored})",
            (
                f"last failed probe started {self.recovery_s:.1f}s after the repair; "
                f"consumers settled {self.settle_s:.1f}s after the load stopped; "
                f"CPU contention {self.contention:.1f} (allowed {self.allowed_recover_s:.1f}s)"
            ),
            f"failed probes started after the repair: {dict(self.after_repair) or 'none'}",
        ]
        if self.index_docs is not None:
            lines.append(f"index: {self.index_docs} docs, equal to SQL")
        if self.checkpoints is not None:
            lines.append(f"checkpoints: {self.checkpoints}")
        lines.append(self.prober.table())
        lines += [f"  e.g. {outcome}: {example[:160]}" for outcome, example in sorted(self.prober.examples.items())]
        return "\n".join(lines)

    def assert_ok(self) -> None:
        print(self.summary())
        problems = list(self.problems) + self.sql.problems
        if self.recovery_s > self.allowed_recover_s:
            problems.append(
                f"queries still failed {self.recovery_s:.1f}s after the repair (allowed: {self.timing.recover_s:.0f}s"
                f" x CPU contention {self.contention:.1f})"
            )
        if self.prober.wrong:
            problems.append(f"{len(self.prober.wrong)} wrong answer(s):\n  " + "\n  ".join(self.prober.wrong[:10]))
        internal = sum(n for (_, outcome), n in self.prober.counts.items() if outcome == "error:internal")
        if internal:  # the service's answer to an exception nobody expected: a bug, even if typed
            problems.append(f"{internal} internal error(s), e.g. {self.prober.examples['error:internal']}")
        if self.prober.untyped:
            problems.append(f"{len(self.prober.untyped)} untyped error(s):\n  " + "\n  ".join(self.prober.untyped[:5]))
        assert not problems, f"{self.fault}:\n" + "\n".join(problems)


async def _call(action: Action) -> None:
    if inspect.iscoroutinefunction(action):
        await action()
    else:  # a server's start() blocks until it is ready: not on the loop, so the load goes on meanwhile
        await asyncio.to_thread(action)


async def connect(stack: Stack, app: str) -> MemoryClient:
    return await MemoryClient.connect(
        stack.settings.nats.url.split(","),
        app=app,
        timeout=2.0,
        wait_ms=2000,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,
        connect_timeout=2,
    )


async def wait_ready(client: MemoryClient, stack: Stack, durables: list[str]) -> None:
    """Until every worker process says it serves, the query service answers
    and every consumer exists (workers create them as they start; the
    indexing worker once its index is ready). The processes are waited for
    first, by their own word rather than a fixed time: on a loaded machine,
    starting three workers on an R3 stream and preparing the index took
    over the 60 s the consumer check allows ("consumer not found" before any
    fault)."""
    for workers in stack.workers.values():
        for worker in workers:
            await asyncio.to_thread(worker.wait_ready, WORKERS_READY_S)

    async def answering() -> bool:
        try:
            await client.history("nobody", "nothing", min_seq=0)
        except NotFound:
            return True
        return False

    await wait_for(answering, timeout=60, what="the query service")
    js = client.nc.jetstream()
    for durable in durables:

        async def exists(durable=durable) -> bool:
            await js.consumer_info(stack.settings.streams.events, durable)
            return True

        await wait_for(exists, timeout=60, what=f"consumer {durable}")


async def run_fault(
    stack: Stack,
    fault: Fault,
    *,
    app: str,
    search: bool = False,
    summary_history: bool = False,
    timing: Timing = Timing(),
    sessions: int = 4,
    rate_per_session: float = 4.0,
) -> Report:
    s = stack.settings
    durables = [s.persistence.durable] + ([s.indexing.durable] if search else [])
    ledger = Ledger(app)
    load_client, probe_client = await connect(stack, app), await connect(stack, app)
    engine = create_engine(s.database_url())
    cpu = CpuContention()
    try:
        await wait_ready(probe_client, stack, durables)
        driver = LoadDriver(load_client, ledger, sessions=sessions, rate_per_session=rate_per_session)
        prober = Prober(
            probe_client, ledger, driver.refs, search=search, recall=search, summary_history=summary_history
        )
        driver.start()
        prober.start()
        await asyncio.sleep(timing.warmup_s)
        killed = time.monotonic()
        await _call(fault.kill)
        await asyncio.sleep(timing.down_s)
        await _call(fault.restore)
        repaired = time.monotonic()
        # Contention is read from the repair on: the catching up that the
        # recovery bound covers happens then (a whole-run mean was diluted by
        # the quiet while a service was down, and a parallel test's burst
        # during the catch-up failed the bound).
        cpu.start()
        await asyncio.sleep(timing.after_s)
        await driver.stop()
        settle_s = await settle(s.nats.url.split(","), s.streams.events, durables)
        await prober.stop()
        cpu.stop()
        stack.check_alive()
        await _recovered(prober, driver.refs)
        report = Report(fault.name, ledger, prober, driver, await check_sql(engine, ledger), timing, settle_s)
        report.recovery_s = max(0.0, prober.last_failure() - repaired)
        report.killed, report.repaired, report.contention = killed, repaired, cpu.factor
        report.after_repair = prober.failures_after(repaired)
        if search:
            report.index_docs = await converge_index(s, engine)
        report.problems += _load_problems(ledger)
        _record(report)
        return report
    except BaseException:
        print(stack.log_tails())
        raise
    finally:
        cpu.stop()
        await load_client.close()
        await probe_client.close()
        await engine.dispose()


async def _recovered(prober: Prober, refs, timeout: float = 30.0) -> None:
    """Ask every session each op until it answers correctly (a WRONG answer is
    recorded by the prober and fails the test; errors are retried, and count
    against the recovery time)."""
    t0 = time.monotonic()
    for ref in refs:
        for op in prober.ops:
            while (outcome := await prober.probe(op, ref)) not in ("correct", "WRONG"):
                if time.monotonic() - t0 > timeout:
                    raise AssertionError(f"{op} of {ref} still fails ({outcome}) {timeout:.0f}s after settling")
                await asyncio.sleep(0.2)


def _record(report: Report) -> None:
    if path := os.environ.get(RECORD_ENV):
        with open(path, "a") as f:
            f.write(json.dumps(report.figures()) + "\n")


def _load_problems(ledger: Ledger) -> list[str]:
    """Publishing recovered too: each session's last event was acked."""
    return [
        f"session {ref}: its last event was never acked ({len(ledger.acked(ref))} of {len(sent)} acked)"
        for ref, sent in ledger.sessions.items()
        if sent[-1].seq is None
    ]


async def checkpoint_report(stack: Stack) -> tuple[int, list[str]]:
    engine = create_engine(stack.settings.database_url())
    try:
        return await checkpoint_problems(engine)
    finally:
        await engine.dispose()
