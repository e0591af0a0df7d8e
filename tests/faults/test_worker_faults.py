"""Each worker kind SIGKILLed under steady load, then restarted: nothing acked
is lost or doubled, the index converges, queries are never wrong, and the
summarizer's checkpoints still form a chain."""

from __future__ import annotations

import asyncio
import time

import nats
import nats.errors
import pytest
from nats.js.errors import BucketNotFoundError, NotFoundError

from memq.workers.runtime.lease import BUCKET as LEASE_BUCKET

from .harness import Fault, checkpoint_report, run_fault

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

APP = "faults-workers"


def kill_then_restart(stack, kind: str, index: int = 0) -> Fault:
    return Fault(
        f"SIGKILL {kind}[{index}] of {len(stack.workers[kind])}",
        lambda: stack.kill(kind, index),
        lambda: stack.restart(kind, index),
    )


async def test_persistence_replica_killed(stack, fresh_nats, pg_url):
    # Batches that take a while to fill: the kill finds one in hand, unacked,
    # and JetStream must redeliver it to the other replica (after ack_wait).
    st = stack(fresh_nats.url, pg_url, {"persistence": {"batch_wait_s": 0.3}})
    st.start("persistence", 2)
    st.start("query")
    report = await run_fault(st, kill_then_restart(st, "persistence"), app=APP)
    report.assert_ok()


async def test_query_replica_killed(stack, fresh_nats, pg_url):
    st = stack(fresh_nats.url, pg_url)
    st.start("persistence")
    st.start("query", 2)
    report = await run_fault(st, kill_then_restart(st, "query"), app=APP)
    report.assert_ok()


async def test_indexing_worker_killed(stack, fresh_nats, pg_url):
    st = stack(fresh_nats.url, pg_url)
    st.start("persistence")
    st.start("indexing")
    st.start("query")
    report = await run_fault(st, kill_then_restart(st, "indexing"), app=APP, search=True)
    report.assert_ok()


async def kill_a_lease_holder(stack, timeout: float = 10.0) -> tuple[int, str]:
    """SIGKILL the summarizer replica that holds a session's lease (it is
    summarizing right now: the hard case), found by watching the lease
    bucket, whose values name the holder's pid. Falls back to replica 0."""
    pids = {w.proc.pid: i for i, w in enumerate(stack.workers["summarizer"])}
    nc = await nats.connect(stack.settings.nats.url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                kv = await js.key_value(LEASE_BUCKET)
                watcher = await kv.watchall()
                break
            except (BucketNotFoundError, NotFoundError):  # no summary yet
                await asyncio.sleep(0.1)
        else:
            stack.kill("summarizer", 0)
            return 0, "no lease was ever taken"
        try:
            while time.monotonic() < deadline:
                entry = await watcher.updates(timeout=max(0.1, deadline - time.monotonic()))
                if entry is not None and entry.value:
                    pid = int(entry.value.decode().rsplit(":", 1)[1])
                    if pid in pids:
                        stack.kill("summarizer", pids[pid])
                        return pids[pid], f"it held the lease {entry.key}"
        except nats.errors.TimeoutError:
            pass
        finally:
            await watcher.stop()
    finally:
        await nc.close()
    stack.kill("summarizer", 0)
    return 0, "no lease seen in time"


async def test_summarizer_replica_killed(stack, fresh_nats, pg_url):
    # A small budget, so that every session needs a summary every few seconds.
    st = stack(
        fresh_nats.url,
        pg_url,
        {
            "memory": {"strategy": "summary_buffer", "budget": 300},
            "summarizer": {"sweep_interval_s": 0.5, "retry_after_s": 0.5, "lease_ttl_s": 2},
        },
    )
    st.start("persistence")
    st.start("query")
    st.start("summarizer", 2)
    killed = []

    async def kill() -> None:
        killed.append(await kill_a_lease_holder(st))

    def restore() -> None:
        st.restart("summarizer", killed[0][0])

    report = await run_fault(
        st, Fault("SIGKILL a summarizer replica mid-summary", kill, restore), app=APP, summary_history=True
    )
    print(f"killed summarizer replica {killed[0][0]}: {killed[0][1]}")
    report.checkpoints, problems = await checkpoint_report(st)
    report.problems += problems
    if report.checkpoints < 2 * len(report.ledger.sessions):
        report.problems.append(f"only {report.checkpoints} checkpoints: the summarizers did not keep up")
    report.assert_ok()
