"""What must hold once a fault is over and the system has settled:

- every consumer has caught up (nothing pending, nothing unacked);
- SQL holds every acked event exactly once, at its acked sequence, and
  nothing else but events whose ack was lost (each once too);
- the index holds exactly the docs SQL's indexable messages make;
- the summarizer's checkpoints form a chain, none duplicated.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import nats
from sqlalchemy import select

from memq.workers.index.backends import open_backend
from memq.workers.memory.recall import doc_for
from memq.workers.settings import Settings
from memq.workers.sql import reads
from memq.workers.summarizer.worker import checkpoint_id

from .load import Ledger

EVENTS = reads.EVENTS
CHECKPOINTS = reads.CHECKPOINTS


async def settle(nats_servers: list[str], stream: str, durables: list[str], timeout: float = 120.0) -> float:
    """Wait until every durable has nothing pending and nothing unacked;
    returns the seconds it took."""
    t0 = time.monotonic()
    nc = await nats.connect(nats_servers, max_reconnect_attempts=-1, reconnect_time_wait=0.25)
    js = nc.jetstream(timeout=2.0)
    state: dict[str, str] = {}
    try:
        while True:
            done = True
            for durable in durables:
                try:
                    info = await js.consumer_info(stream, durable)
                except Exception as exc:  # noqa: BLE001 - a leader election in progress, say
                    state[durable] = f"unknown ({type(exc).__name__})"
                    done = False
                    continue
                state[durable] = f"pending {info.num_pending}, unacked {info.num_ack_pending}"
                done &= info.num_pending == 0 and info.num_ack_pending == 0
            if done:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"consumers did not catch up within {timeout:.0f}s: {state}")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


@dataclass
class SqlReport:
    rows: int = 0
    acked: int = 0
    ack_lost_but_stored: int = 0  # published, no ack came back, committed once
    problems: list[str] = field(default_factory=list)


async def check_sql(engine, ledger: Ledger) -> SqlReport:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(EVENTS.c.event_id, EVENTS.c.session_key, EVENTS.c.seq))).all()
    report = SqlReport(rows=len(rows), acked=len(ledger.all_acked()))
    counts = Counter(r.event_id for r in rows)
    dups = [eid for eid, n in counts.items() if n > 1]
    if dups:
        report.problems.append(f"{len(dups)} event(s) stored more than once, e.g. {dups[0]}")
    by_id = {r.event_id: r for r in rows}
    missing = [s for s in ledger.all_acked() if s.event_id not in by_id]
    if missing:
        report.problems.append(
            f"{len(missing)} acked event(s) missing from SQL, e.g. {missing[0].event_id} (seq {missing[0].seq})"
        )
    for s in ledger.all_acked():
        r = by_id.get(s.event_id)
        if r is not None and (r.session_key, r.seq) != (ledger.session_key(s), s.seq):
            report.problems.append(
                f"event {s.event_id} acked at seq {s.seq} is stored at seq {r.seq} (or in another session)"
            )
    for eid, r in by_id.items():
        s = ledger.sent.get(eid)
        if s is None:
            report.problems.append(f"event {eid} at seq {r.seq} in SQL was never published")
        elif s.seq is None:
            report.ack_lost_but_stored += 1
    return report


async def expected_docs(engine, scope: str) -> set[str]:
    """The doc uuids a rebuild from SQL would write (context text aside)."""
    uuids = set()
    async for batch in reads.indexable_messages(engine):
        for seq, message in batch:
            if (doc := doc_for(seq, message, scope)) is not None:
                uuids.add(doc.uuid)
    return uuids


async def index_problems(settings: Settings, engine) -> list[str]:
    backend = open_backend(settings)
    await backend.open()
    try:
        actual = [d.uuid async for d in backend.export()]
    finally:
        await backend.close()
    expected = await expected_docs(engine, settings.indexing.storage_scope)
    problems = []
    dups = [u for u, n in Counter(actual).items() if n > 1]
    if dups:
        problems.append(f"{len(dups)} doc(s) indexed twice")
    if extra := set(actual) - expected:
        problems.append(f"{len(extra)} doc(s) in the index but not in SQL")
    if missing := expected - set(actual):
        problems.append(f"{len(missing)} of {len(expected)} SQL doc(s) missing from the index")
    return problems


async def converge_index(settings: Settings, engine, timeout: float = 30.0) -> int:
    """Until the index matches SQL; returns the number of docs. A settled
    indexing consumer means it is already there, so the wait is short."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            problems = await index_problems(settings, engine)
        except Exception as exc:  # noqa: BLE001 - the index server may still be starting
            problems = [f"reading the index failed: {type(exc).__name__}: {exc}"]
        if not problems:
            return len(await expected_docs(engine, settings.indexing.storage_scope))
        if time.monotonic() > deadline:
            raise AssertionError("the index did not converge to SQL: " + "; ".join(problems))
        await asyncio.sleep(0.5)


async def checkpoint_problems(engine) -> tuple[int, list[str]]:
    """(checkpoints, problems): per session, up_to_seq strictly increasing in
    stream order, each below its own seq, ids as the summarizer derives them."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(CHECKPOINTS).order_by(CHECKPOINTS.c.session_key, CHECKPOINTS.c.seq))).all()
    problems = []
    by_session: dict[str, list] = {}
    for r in rows:
        by_session.setdefault(r.session_key, []).append(r)
    for key, chain in by_session.items():
        ups = [r.up_to_seq for r in chain]
        if len(set(ups)) != len(ups):
            problems.append(
                f"session {key[:8]}: duplicate checkpoints up to {sorted(u for u, n in Counter(ups).items() if n > 1)}"
            )
        if ups != sorted(ups):
            problems.append(f"session {key[:8]}: checkpoints out of order {ups}")
        if any(r.up_to_seq >= r.seq for r in chain):
            problems.append(f"session {key[:8]}: a checkpoint covers events after itself")
        if any(r.checkpoint_id != checkpoint_id(key, r.up_to_seq) for r in chain):
            problems.append(f"session {key[:8]}: a checkpoint id is not derived from its fold")
    return len(rows), problems
