"""The turn without the wait (memq.contracts.carry, memq.workers.query.carried):
with the persistence worker stopped, a client's history and context right
after its own appends are answered from SQL plus the writes it carries,
and each answer is the one the same read gives once they are committed.
What the carried writes cannot say (a session created with
``create_session``, a delete, writes the client no longer remembers) makes
the read wait for the commit; a session SQL does not hold yet is read from
the carried writes alone."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager

import pytest
from helpers import make_settings, running_query, running_worker, wait_committed

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotCommitted
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers import metrics

APP = "carry-app"
USER = "u"


def text(role: str, body: str) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=body)]))


def tail_reads() -> float:
    return metrics.QUERY_TAIL.labels("tail")._value.get()


@asynccontextmanager
async def stack(nats_url, db_url, tmp_path):
    """The query worker and a client; the session ``s`` committed with a few
    events, then the persistence worker stopped: a read that waits times out."""
    s = make_settings(nats_url, db_url, tmp_path)
    async with running_query(s), await MemoryClient.connect(nats_url, app=APP, wait_ms=300) as client:
        async with running_worker(s):
            for i in range(3):
                seq = await client.append(USER, "s", text("user", f"committed {i}"))
            await wait_committed(nats_url, seq)
        yield s, client


READS = [
    ("history", {}),
    ("history", {"strategy": {"kind": "buffer_window", "window": 4}}),
    ("context", {"format": "openai", "recall_limit": 0}),
    ("context", {"format": "memq", "strategy": {"kind": "token_window", "budget": 300}, "recall_limit": 0}),
]


async def read(client: MemoryClient, op: str, **options):
    return await getattr(client, op)(USER, "s", **options)


@pytest.mark.parametrize(("db", "seed"), [("sqlite_url", 1), ("pg_url", 2)])
async def test_own_appends_read_as_they_will_commit(nats_url, tmp_path, request, db, seed):
    rng = random.Random(seed)
    async with stack(nats_url, request.getfixturevalue(db), tmp_path) as (s, client):
        written: list[Event] = []
        for round_ in range(4):
            for _ in range(rng.randint(1, 5)):
                what = rng.random()
                if what < 0.6 or not written:
                    event = text(rng.choice(["user", "assistant"]), f"r{round_} " + "x" * rng.randint(1, 400))
                    await client.append(USER, "s", event)
                    written.append(event)
                elif what < 0.7:  # appending an event again stores it once
                    await client.append(USER, "s", rng.choice(written))
                elif what < 0.8:
                    events = [text("assistant", f"many {round_}.{i}") for i in range(3)]
                    await client.append_many(USER, "s", events)
                    written += events
                elif what < 0.9:  # state and artifacts leave the events as they are
                    await client.set_state(USER, {"k": what}, session="s")
                else:
                    await client.save_artifact(USER, "s", "notes.txt", b"some bytes")
            last = text("user", f"turn {round_}")
            seq = await client.append(USER, "s", last)
            written.append(last)

            before = tail_reads()
            answers = [await read(client, op, **options) for op, options in READS]  # nothing commits meanwhile
            assert tail_reads() - before == len(READS)

            async with running_worker(s):
                await wait_committed(nats_url, seq)
            for (op, options), answer in zip(READS, answers, strict=True):
                assert answer.committed_seq is not None  # what the client then forgets
                committed = await read(client, op, **options)
                assert answer.model_copy(update={"committed_seq": None}) == committed, (op, options)

        every = await client.history(USER, "s", strategy={"kind": "all"})
        assert [e.event["id"] for e in every.events[3:]] == [e.id for e in written]


async def test_a_new_sessions_first_turn_reads_as_it_will_commit(nats_url, sqlite_url, tmp_path):
    """An agent's first turn of a conversation (appends to a session SQL
    does not hold, without ``create_session``) is answered from what it
    carries, as the same reads answer once it is committed."""
    async with stack(nats_url, sqlite_url, tmp_path) as (s, client):
        await client.append(USER, "fresh", text("user", "hello"))
        seq = await client.append(USER, "fresh", text("assistant", "hi, how can I help?"))
        before = tail_reads()
        answers = [await getattr(client, op)(USER, "fresh", **options) for op, options in READS]
        assert tail_reads() - before == len(READS)
        async with running_worker(s):
            await wait_committed(nats_url, seq)
        for (op, options), answer in zip(READS, answers, strict=True):
            committed = await getattr(client, op)(USER, "fresh", **options)
            assert answer.model_copy(update={"committed_seq": None}) == committed, (op, options)


async def test_what_the_carried_writes_cannot_say_waits(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path) as (s, client):
        await client.append(USER, "s", text("user", "plain"))
        await read(client, "history")  # answered without the commit
        # An explicit min_seq promises every write up to it, whoever wrote it: it waits.
        with pytest.raises(NotCommitted):
            await client.history(USER, "s", min_seq=client.last_seq)
        # What the carried tail does not read: filters, an instruction, other clients' writes.
        with pytest.raises(NotCommitted):
            await client.history(USER, "s", roles=["user"])
        with pytest.raises(NotCommitted):
            await client.context(USER, "s", instruction="Be brief.", recall_limit=0)
        with pytest.raises(NotCommitted):
            await client.history(USER, "s", consistency="any")
        # A session created by a message of its own, which SQL does not hold yet.
        await client.create_session(USER, "new")
        await client.append(USER, "new", text("user", "first"))
        with pytest.raises(NotCommitted):
            await client.history(USER, "new")
        # A user-level write of this client: the read cannot know what it did.
        await client.set_state(USER, {"user:lang": "en"})
        with pytest.raises(NotCommitted):
            await client.history(USER, "s")

    async with stack(nats_url, sqlite_url, tmp_path) as (s, client):
        # A delete.
        await client.append(USER, "s", text("user", "doomed"))
        await client.delete_session(USER, "s", missing_ok=True)  # nothing committed to check against
        with pytest.raises(NotCommitted):
            await client.history(USER, "s")


async def test_without_carrying_the_turn_waits(nats_url, sqlite_url, tmp_path):
    """The control: the same read from a client that carries nothing waits
    for the commit (the persistence worker is stopped, so it times out)."""
    async with stack(nats_url, sqlite_url, tmp_path) as (s, client):
        plain = MemoryClient(client.nc, APP, wait_ms=300, carry_writes=False)
        await plain.append(USER, "s", text("user", "not carried"))
        with pytest.raises(NotCommitted):
            await plain.history(USER, "s")
