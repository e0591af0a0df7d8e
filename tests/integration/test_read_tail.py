"""Read-your-writes from the stream (memq.workers.query.stream_tail): with the
persistence worker stopped, a history or context with ``min_seq`` is
answered from SQL plus the session's uncommitted messages, and the answer is
the one the same read gives once those messages are committed. What needs
the commit's rules (deletes, checkpoints, the user's messages) waits for it."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager

import nats
import orjson
import pytest
from helpers import make_settings, running_query, running_worker, wait_committed

from memq.contracts.client import MemoryClient
from memq.contracts.codec import encode
from memq.contracts.schemas import CheckpointSaved, Event, EventAppended, Message, TextPart
from memq.contracts.subjects import EVENTS_STREAM, events_subject, request_subject
from memq.workers import metrics

APP = "tail-app"
USER = "u"


def text(role: str, body: str) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=body)]))


async def ask(nc, op: str, wait_ms: int = 10_000, **body) -> dict:
    request = {"v": 1, "app": APP, "user": USER, "wait_ms": wait_ms, **body}
    reply = await nc.request(request_subject(APP, op), orjson.dumps(request), timeout=wait_ms / 1000 + 5)
    return orjson.loads(reply.data)


def tail_reads(outcome: str) -> float:
    return metrics.QUERY_TAIL.labels(outcome)._value.get()


@asynccontextmanager
async def stack(nats_url, db_url, tmp_path, **query):
    """The query worker, a client, a raw connection, and the session ``s``
    committed with a few events; the persistence worker is stopped after."""
    s = make_settings(nats_url, db_url, tmp_path)
    s.query = s.query.model_copy(update={"read_tail": True, **query})
    async with running_query(s), await MemoryClient.connect(nats_url, app=APP) as client:
        nc = await nats.connect(nats_url)
        try:
            async with running_worker(s):
                for i in range(3):
                    seq = await client.append(USER, "s", text("user", f"committed {i}"))
                await wait_committed(nats_url, seq)
            yield s, client, nc
        finally:
            await nc.close()


# Reads that take the tail: each one's answer is compared with the committed one.
READS = [
    ("history", {"session": "s"}),
    ("history", {"session": "s", "strategy": {"kind": "buffer_window", "window": 4}}),
    ("context", {"session": "s", "message": "what next?"}),
    ("context", {"session": "s", "format": "memq", "strategy": {"kind": "token_window", "budget": 300}}),
]


@pytest.mark.parametrize(("db", "seed"), [("sqlite_url", 1), ("sqlite_url", 2), ("pg_url", 3)])
async def test_uncommitted_appends_read_as_they_will_commit(nats_url, tmp_path, request, db, seed):
    rng = random.Random(seed)
    async with stack(nats_url, request.getfixturevalue(db), tmp_path) as (s, client, nc):
        js = nc.jetstream()
        subject = events_subject(APP, USER, "s")
        written: list[Event] = []
        for round_ in range(5):
            for _ in range(rng.randint(1, 6)):
                what = rng.random()
                if what < 0.45 or not written:
                    event = text(rng.choice(["user", "assistant"]), f"r{round_} " + "x" * rng.randint(1, 400))
                    await client.append(USER, "s", event)
                    written.append(event)
                elif what < 0.6:  # an id the session holds (or the tail), under another Nats-Msg-Id
                    again = rng.choice(written).model_copy(update={"timestamp": 1.0})
                    msg = EventAppended(app=APP, user=USER, session="s", event=again)
                    await js.publish(subject, encode(msg), stream=EVENTS_STREAM, headers={"Nats-Msg-Id": f"d{what}"})
                elif what < 0.7:  # dead-lettered: never written
                    await js.publish(subject, b'{"v": 1, "kind": "event"', stream=EVENTS_STREAM)
                elif what < 0.8:
                    await client.set_state(USER, {"k": what}, session="s")
                elif what < 0.9:
                    await client.append(USER, "other", text("user", "another session"))
                else:
                    await client.save_artifact(USER, "s", "notes.txt", b"some bytes")
            last = text("user", f"turn {round_}")  # the session's write last, as an agent's turn ends
            seq = await client.append(USER, "s", last)
            written.append(last)

            before = tail_reads("tail")
            answers = []
            for op, body in READS:  # nothing commits meanwhile: a wait would time out
                reply = await ask(nc, op, min_seq=seq, **body)
                assert reply["ok"], reply
                answers.append(reply["result"])
            assert tail_reads("tail") - before == len(READS)

            async with running_worker(s):
                await wait_committed(nats_url, seq)
            for (op, body), answer in zip(READS, answers, strict=True):
                committed = await ask(nc, op, min_seq=seq, **body)
                assert committed["ok"], committed
                # The tail's answer also says what was committed when it was read.
                assert {**answer, "committed_seq": None} == committed["result"], (op, body)

        every = (await ask(nc, "history", session="s", strategy={"kind": "all"}))["result"]["events"]
        assert [e["event"]["id"] for e in every[3:]] == [e.id for e in written]


async def ask_or_wait(nc, op: str, seq: int, **body) -> str:
    """``tail`` if answered without the commit, ``waited`` if it timed out waiting for it."""
    reply = await ask(nc, op, min_seq=seq, wait_ms=300, **body)
    if reply["ok"]:
        return "tail"
    assert reply["error"]["code"] == "not_committed", reply
    return "waited"


async def test_what_needs_the_commit_waits_for_it(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path) as (s, client, nc):
        js = nc.jetstream()
        seq = await client.append(USER, "s", text("user", "plain"))
        assert await ask_or_wait(nc, "history", seq, session="s") == "tail"
        # What the tail does not read: filters, an instruction (state), later pages.
        assert await ask_or_wait(nc, "history", seq, session="s", roles=["user"]) == "waited"
        assert await ask_or_wait(nc, "context", seq, session="s", instruction="Be brief.") == "waited"
        # min_seq of another session's write: every message up to it is held.
        other = await client.append(USER, "other", text("user", "elsewhere"))
        assert await ask_or_wait(nc, "history", other, session="s") == "tail"
        # A min_seq the stream does not hold: no tail answers it, and no commit
        # ever will, so it is refused at once rather than left to time out.
        reply = await ask(nc, "history", min_seq=other + 1000, wait_ms=300, session="s")
        assert reply["error"]["code"] == "invalid_request" and "beyond the events stream" in reply["error"]["message"]
        # A session that SQL does not hold yet begins in the tail.
        fresh = await client.append(USER, "new", text("user", "first"))
        assert await ask_or_wait(nc, "history", fresh, session="new") == "tail"
        # The user's own subject (a user delete, user state) since the floor.
        await client.set_state(USER, {"user:k": 1})
        seq = await client.append(USER, "s", text("user", "after user state"))
        assert await ask_or_wait(nc, "history", seq, session="s") == "waited"
        async with running_worker(s):
            await wait_committed(nats_url, seq)

        checkpoint = CheckpointSaved(app=APP, user=USER, session="s", up_to_seq=seq, summary="so far", author="t")
        await js.publish(events_subject(APP, USER, "s"), encode(checkpoint), stream=EVENTS_STREAM)
        seq = await client.append(USER, "s", text("user", "after a checkpoint"))
        assert await ask_or_wait(nc, "history", seq, session="s") == "waited"
        async with running_worker(s):
            await wait_committed(nats_url, seq)

        await client.delete_session(USER, "s")
        seq = await client.append(USER, "s", text("user", "after the delete"))
        assert await ask_or_wait(nc, "history", seq, session="s") == "waited"
        async with running_worker(s):
            await wait_committed(nats_url, seq)
        # Once committed, the same read shows the delete.
        reply = await ask(nc, "history", min_seq=seq, session="s", strategy={"kind": "all"})
        assert [e["event"]["message"]["parts"][0]["text"] for e in reply["result"]["events"]] == ["after the delete"]


async def test_a_tail_too_long_waits(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path, tail_max_messages=64) as (s, client, nc):
        seqs = await client.append_many(USER, "s", [text("user", f"m{i}") for i in range(64)])
        assert await ask_or_wait(nc, "history", seqs[-1], session="s") == "tail"
        seq = await client.append(USER, "s", text("user", "one more"))
        assert await ask_or_wait(nc, "history", seq, session="s") == "waited"


async def test_off_always_waits(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    assert not s.query.read_tail  # the default
    async with running_query(s), await MemoryClient.connect(nats_url, app=APP) as client:
        nc = await nats.connect(nats_url)
        try:
            async with running_worker(s):
                seq = await client.append(USER, "s", text("user", "committed"))
                await wait_committed(nats_url, seq)
            seq = await client.append(USER, "s", text("user", "not committed"))
            assert await ask_or_wait(nc, "history", seq, session="s") == "waited"
        finally:
            await nc.close()


async def test_every_turn_reads_its_append_while_commits_land_meanwhile(nats_url, pg_url, tmp_path):
    """An agent's turns with the persistence worker running: each read races
    the commit of what it reads from the stream (found by agent_loop.py: an
    append committed between the window's read and the id check was taken
    for a duplicate)."""
    s = make_settings(nats_url, pg_url, tmp_path)
    s.query.read_tail = True
    async with running_worker(s), running_query(s), await MemoryClient.connect(nats_url, app=APP) as client:
        for i in range(150):
            said = f"turn {i} " + "x" * 250
            seq = await client.append_text(USER, "s", "user", said)
            ctx = await client.context(USER, "s", format="openai", recall_limit=0, min_seq=seq)
            assert ctx.messages[-1]["content"] == said, i
            await client.append_text(USER, "s", "assistant", f"answer {i}")
