"""Faults inside the Compose deployment under a steady client (issue 39, item 3):
stop the NATS node that leads the app's events stream (MEMQ_EVENTS_support-bot), then a persistence replica, then
an indexing replica, then PostgreSQL, each for a while, and start it again.
Afterwards every acknowledged append is in SQL exactly once, at the sequence
its ack named (counted in PostgreSQL against the client's acks), the
consumers drain to zero, and the time reads took to recover is measured.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from pathlib import Path

import agent
import nats
import stack
from podctl import Failed, healthy, podman, say

EVENTS = f"MEMQ_EVENTS_{stack.APP}"  # the app's own events stream (MEMQ_STREAMS__APPS in the stack's settings)

DOWN_S = 10.0  # each fault lasts this long (the issue: PostgreSQL for 10 s)


async def admin(env: dict[str, str]):
    """A connection to the deployment's NATS as its admin user, over its TLS."""
    return await nats.connect(
        stack.NATS_URLS,
        user="admin",
        password=env["NATS_ADMIN_PASSWORD"],
        tls=ssl.create_default_context(cafile=str(Path(env["MEMQ_NATS_TLS_DIR"]) / "ca.crt")),
    )


async def stream_leader(env: dict[str, str]) -> str:
    nc = await admin(env)
    try:
        return str((await nc.jetstream().stream_info(EVENTS)).cluster.leader)
    finally:
        await nc.close()


async def consumers_drained(env: dict[str, str], timeout: float = 180) -> dict[str, int]:
    """Wait for both durable consumers to have nothing pending or unacked."""
    nc = await admin(env)
    try:
        js, deadline = nc.jetstream(), time.monotonic() + timeout
        while True:
            lag = {}
            for durable in ("memq-persistence", "memq-indexing"):
                for stream in ("MEMQ_EVENTS", EVENTS):
                    info = await js.consumer_info(stream, durable)
                    lag[durable] = lag.get(durable, 0) + int(info.num_pending or 0) + int(info.num_ack_pending or 0)
            if not any(lag.values()):
                return lag
            if time.monotonic() > deadline:
                raise Failed(f"consumers not drained in {timeout:.0f} s: {lag}")
            await asyncio.sleep(1)
    finally:
        await nc.close()


def sql_texts() -> dict[str, list[int]]:
    """Every stored event's text -> the sequences it is stored at (psql in the postgres container)."""
    out = podman(
        "exec",
        stack.name("postgres"),
        "psql",
        "-U",
        "memq",
        "-d",
        "memq",
        "-At",
        "-c",
        "select seq, data from memq_events",
        quiet=True,
    ).stdout
    stored: dict[str, list[int]] = {}
    for line in out.splitlines():
        seq, _, data = line.partition("|")
        text = json.loads(data)["message"]["parts"][0]["text"]
        stored.setdefault(text, []).append(int(seq))
    return stored


def count(steady: agent.Steady, timeout: float = 120) -> dict[str, int]:
    """Acknowledged appends against SQL: lost, duplicated, stored at another sequence."""
    deadline = time.monotonic() + timeout
    while True:
        stored = {t: s for t, s in sql_texts().items() if t.startswith("steady ")}
        lost = [seq for seq, text in steady.acked.items() if text not in stored]
        if not lost or time.monotonic() > deadline:
            break
        time.sleep(2)
    counts = {
        "acknowledged": len(steady.acked),
        "in_sql": sum(1 for text in steady.acked.values() if text in stored),
        "lost": len(lost),
        "duplicated": sum(1 for seqs in stored.values() if len(seqs) > 1),
        "wrong_seq": sum(1 for seq, text in steady.acked.items() if text in stored and stored[text] != [seq]),
        "unacknowledged_tries": len(steady.unknown),
        "unacknowledged_stored": sum(1 for text in steady.unknown if text in stored),
        "sql_rows": sum(len(stored.get(text, [])) for text in set(steady.acked.values()) | set(steady.unknown)),
    }
    return counts


async def run(secrets: stack.Secrets, env: dict[str, str], down_s: float = DOWN_S) -> dict[str, object]:
    client = await agent.connect(
        stack.NATS_URLS, secrets.tls / "ca.crt", stack.APP, secrets.password(f"app-{stack.APP}")
    )
    steady = agent.Steady(client)
    task = asyncio.create_task(steady.run())
    phases = []
    try:
        await asyncio.sleep(5)
        leader = await stream_leader(env)
        for label, container in (
            (f"NATS node {leader} (the {EVENTS} leader)", stack.name(leader)),
            ("a persistence replica", stack.name("persistence", 1)),
            ("an indexing replica", stack.name("indexing", 1)),
            ("PostgreSQL", stack.name("postgres")),
        ):
            failures0, acked0, started = len(steady.failures), len(steady.acked), time.monotonic()
            say(f"fault: stopping {label} for {down_s:.0f} s, {len(steady.acked)} appends acknowledged so far")
            await asyncio.to_thread(podman, "stop", "-t", "10", container, quiet=True)
            stopped = time.monotonic()
            await asyncio.sleep(down_s)
            await asyncio.to_thread(podman, "start", container, quiet=True)
            restarted = time.monotonic()
            await asyncio.to_thread(healthy, container, 180)
            ready = time.monotonic() - restarted
            recovery = await steady.recovered(restarted)
            await asyncio.sleep(3)
            ended = time.monotonic()
            failed = steady.failures[failures0:]
            phase = {
                "fault": label,
                "stop_took_s": round(stopped - started, 1),
                "down_s": round(restarted - stopped, 1),
                "ready_after_start_s": round(ready, 1),
                "first_read_after_start_s": round(recovery, 1),
                "longest_read_gap_s": round(steady.longest_read_gap(started, ended), 1),
                "acked_during": len(steady.acked) - acked0,
                "failed_appends": sum(1 for f in failed if f[1] == "append"),
                "failed_reads": sum(1 for f in failed if f[1] == "read"),
                "errors": sorted({f[2].split(":")[0] for f in failed}),
            }
            say(f"  {phase}")
            phases.append(phase)
    finally:
        steady.stopping = True
        await task
        await client.close()
    lag = await consumers_drained(env)
    counts = await asyncio.to_thread(count, steady)
    say(f"fault run: {counts}; consumers drained {lag}; reads ok {steady.reads_ok}")
    if counts["lost"] or counts["duplicated"] or counts["wrong_seq"]:
        raise Failed(f"acknowledged appends lost or duplicated: {counts}")
    return {"phases": phases, "counts": counts, "reads_ok": steady.reads_ok}
