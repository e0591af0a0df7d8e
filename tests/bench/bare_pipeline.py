"""The agent's turn through memq's hops with none of memq's work: the floor
of the design on a machine.

``tests/bench/agent_loop.py`` runs this beside memq and direct SQL. The turn
takes the path memq's does, process to process, so it pays every hop memq
pays (each a loopback write that wakes another process) and nothing else:

1. the client publishes the user event to a JetStream stream (file storage,
   ``Nats-Msg-Id`` and ``Nats-Expected-Stream`` headers, as memq's client
   does) and awaits the PubAck;
2. a **persister** process takes it from a durable consumer, runs one
   ``INSERT`` (a transaction per batch of what has arrived), acks, and
   publishes a notice with the highest committed stream sequence;
3. the client asks an **answerer** process (core NATS request/reply) for the
   session's last 50 rows with ``min_seq``; the answerer waits for a notice
   at or past it (no polling), runs one ``SELECT`` and replies with the rows;
4. the client publishes the assistant event and awaits its PubAck.

What it leaves out is memq itself: validation, token counts, session rows
and checkpoints, strategies, caching, typed replies, dead letters, order
across replicas. So memq's turn minus this one is what memq's own work
costs, and this one beside the direct-SQL turn is what the hops cost.

A second answerer, ``answer-from-tail``, answers without waiting for the
commit (SQL plus the uncommitted events it holds from the stream), as
memq's ``query.read_tail`` does: the floor of that design.

Run as a process by agent_loop.py: ``bare_pipeline.py persist|answer|answer-from-tail NATS_URL DSN``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque

import asyncpg
import nats
import orjson
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

STREAM = "BARE"
# Two variants, one stream and one persister: each answerer hears only its
# own variant's events and notices, so neither is woken by the other's turns.
VARIANTS = ("wait", "tail")  # the answerer waits for the commit, or reads the tail
SUBJECTS = "bare.events.>"
DURABLE = "bare-persist"


def events_subject(variant: str) -> str:
    return f"bare.events.{variant}"


def notice_subject(variant: str) -> str:
    return f"bare.committed.{variant}"


def answer_subject(variant: str) -> str:
    return f"bare.answer.{variant}"


BATCH = 256  # at most this many rows in one transaction (memq's batch_size)


def turns_table(name: str, seq: str) -> str:
    """The table of turns both floors write: the direct-SQL one numbers rows
    itself (an identity), the bare pipeline by stream sequence."""
    return f"""
CREATE TABLE IF NOT EXISTS {name} (
    session_id text NOT NULL,
    seq {seq},
    role text NOT NULL,
    data jsonb NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (session_id, seq)
)
"""


SCHEMA = turns_table("bare_turns", "bigint NOT NULL")
INSERT = "INSERT INTO bare_turns VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
SELECT = "SELECT seq, role, data FROM bare_turns WHERE session_id = $1 ORDER BY seq DESC LIMIT 50"


async def prepare(nc, dsn: str) -> None:
    """The stream and the table (agent_loop.py, before the processes start)."""
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECTS], storage=StorageType.FILE))
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
    finally:
        await conn.close()


async def persist(nc, dsn: str) -> None:
    """Commit what arrives, a batch per transaction; ack; announce the seq."""
    conn = await asyncpg.connect(dsn)
    js = nc.jetstream()
    arrived: asyncio.Queue = asyncio.Queue()

    async def on_message(msg) -> None:
        arrived.put_nowait(msg)

    # A durable push consumer: the server hands messages over as they come,
    # the cheapest delivery nats-py offers.
    config = ConsumerConfig(ack_policy="explicit", max_ack_pending=4096)
    await js.subscribe(SUBJECTS, durable=DURABLE, stream=STREAM, manual_ack=True, cb=on_message, config=config)
    while True:
        batch = [await arrived.get()]
        while not arrived.empty() and len(batch) < BATCH:
            batch.append(arrived.get_nowait())
        rows = []
        for msg in batch:
            event = orjson.loads(msg.data)
            rows.append((event["session"], msg.metadata.sequence.stream, event["role"], msg.data.decode(), event["at"]))
        async with conn.transaction():
            await conn.executemany(INSERT, rows)
        for msg in batch:
            await msg.ack()
        # one persister commits in stream order: the batch's last seq is the floor
        floor = b"%d" % max(r[1] for r in rows)
        for variant in {msg.subject.rpartition(".")[2] for msg in batch}:
            await nc.publish(notice_subject(variant), floor)


async def answer(nc, dsn: str) -> None:
    """The last 50 rows of a session, once its ``min_seq`` is committed."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=64)
    committed = 0
    moved = asyncio.Event()

    async def on_committed(msg) -> None:
        nonlocal committed, moved
        committed = max(committed, int(msg.data))
        moved.set()
        moved = asyncio.Event()  # the next wait waits for the next notice

    async def reply(msg) -> None:
        ask = orjson.loads(msg.data)
        while committed < ask["min_seq"]:
            await moved.wait()
        async with pool.acquire() as conn:
            rows = await conn.fetch(SELECT, ask["session"])
        await msg.respond(orjson.dumps([[r["seq"], r["role"], r["data"]] for r in rows]))

    await nc.subscribe(notice_subject("wait"), cb=on_committed)
    await serve(nc, answer_subject("wait"), reply)


async def answer_from_tail(nc, dsn: str) -> None:
    """The same answer without waiting for the commit: SQL up to the commit
    floor plus the session's uncommitted events, held from the stream (an
    ordered consumer), as ``query.read_tail`` does: the floor of that design."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=64)
    js = nc.jetstream()
    committed = seen = 0
    tails: dict[str, dict[int, list]] = {}  # session → seq → row, for seqs above the floor
    held: deque[tuple[int, str]] = deque()  # (seq, session) in stream order, to drop once committed
    arrived = asyncio.Event()

    async def on_event(msg) -> None:
        nonlocal seen, arrived
        event, seq = orjson.loads(msg.data), msg.metadata.sequence.stream
        tails.setdefault(event["session"], {})[seq] = [seq, event["role"], msg.data.decode()]
        held.append((seq, event["session"]))
        seen = seq
        arrived.set()
        arrived = asyncio.Event()

    async def on_committed(msg) -> None:
        nonlocal committed
        committed = max(committed, int(msg.data))
        while held and held[0][0] <= committed:
            seq, session = held.popleft()
            tail = tails[session]
            del tail[seq]
            if not tail:
                del tails[session]

    async def reply(msg) -> None:
        ask = orjson.loads(msg.data)
        while seen < ask["min_seq"]:  # the request may come before the stream delivers its write
            await arrived.wait()
        # the tail first: what a notice drops during the SELECT is in SQL by then
        tail = [row for seq, row in tails.get(ask["session"], {}).items() if seq > committed]
        async with pool.acquire() as conn:
            rows = [[r["seq"], r["role"], r["data"]] for r in await conn.fetch(SELECT, ask["session"])]
        merged = {row[0]: row for row in rows} | {row[0]: row for row in tail}
        await msg.respond(orjson.dumps(sorted(merged.values(), reverse=True)[:50]))

    await nc.subscribe(notice_subject("tail"), cb=on_committed)
    await js.subscribe(events_subject("tail"), ordered_consumer=True, cb=on_event)
    await serve(nc, answer_subject("tail"), reply)


async def serve(nc, subject: str, reply) -> None:
    """Answer requests on ``subject`` with ``reply(msg)``, a task each (they
    wait on commits concurrently), until killed."""
    tasks: set[asyncio.Task] = set()

    async def on_request(msg) -> None:
        task = asyncio.create_task(reply(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await nc.subscribe(subject, queue="bare", cb=on_request)
    await asyncio.Event().wait()


class BareClient:
    """The client's side of the bare turn (agent_loop.py's ``BareLoop``)."""

    def __init__(self, nc, variant: str = "wait"):
        self.nc = nc
        self.js = nc.jetstream()
        self.events, self.answers = events_subject(variant), answer_subject(variant)

    async def append(self, session: str, role: str, text: str, msg_id: str) -> int:
        body = orjson.dumps({"session": session, "role": role, "content": text, "at": time.time()})
        headers = {"Nats-Msg-Id": msg_id, "Nats-Expected-Stream": STREAM}
        return (await self.js.publish(self.events, body, headers=headers)).seq

    async def last_50(self, session: str, min_seq: int) -> list[list]:
        ask = orjson.dumps({"session": session, "min_seq": min_seq})
        return orjson.loads((await self.nc.request(self.answers, ask, timeout=10)).data)


async def main(role: str, url: str, dsn: str) -> None:
    nc = await nats.connect(url, name=f"bare-{role}")
    await {"persist": persist, "answer": answer, "answer-from-tail": answer_from_tail}[role](nc, dsn)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
