"""Idempotency keys that belong to their tenant (issue 27, item 2), on a real
nats-server with the persistence worker (and the summarizer where it matters).

JetStream's duplicate window is per stream, so a bare ``Nats-Msg-Id`` let one
app make the stream drop another's message: B's append returned A's sequence
and B's event was never stored; forged checkpoint ids kept B's session from
being summarized while the summarizer retried in a tight loop. The dedupe id is
now scoped to the subject and holds a digest of the content
(:func:`memq.contracts.subjects.dedupe_id`)."""

from __future__ import annotations

import asyncio

import nats
import orjson
from helpers import make_settings, running, running_worker, wait_committed, wait_for

from memq.contracts import codec
from memq.contracts.client import MemoryClient
from memq.contracts.ids import scope_key
from memq.contracts.schemas import CheckpointSaved, Event, EventAppended, Message, TextPart
from memq.contracts.subjects import DLQ_STREAM, dedupe_id, events_subject, status_subject
from memq.workers.runtime import bus
from memq.workers.runtime.dead_letters import DeadLetterFilter, iter_dead_letters
from memq.workers.sql import reads
from memq.workers.summarizer.worker import SummarizerWorker, checkpoint_id

A, B = "app-a", "app-b"


def text_event(text: str, id: str | None = None) -> Event:
    event = Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))
    return event if id is None else event.model_copy(update={"id": id})


async def stored_texts(engine, app: str, user: str, session: str) -> dict[str, str]:
    return {e.event_id: e.data["message"]["parts"][0]["text"] for e in await reads.events(engine, app, user, session)}


async def dead_letters(js, code: str) -> list:
    return [x async for x in iter_dead_letters(js, DLQ_STREAM, DeadLetterFilter(code=code))]


async def test_another_app_using_an_id_first_does_not_drop_the_write(nats_url, sqlite_url, tmp_path):
    """(a) A uses B's event id first, by its client and by raw publishes with
    every header B's message could have had before; B's append is stored,
    with B's own sequence."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    victim = text_event("B's own words", id="evt-0001")
    b_subject = events_subject(B, "bob", "bsess")
    async with running_worker(settings) as worker:
        async with (
            await MemoryClient.connect(nats_url, app=A) as a,
            await MemoryClient.connect(nats_url, app=B) as b,
        ):
            a_seq = await a.append("mallory", "asess", text_event("A's squatting", id=victim.id))
            nc = await nats.connect(nats_url)
            try:
                a_subject = events_subject(A, "mallory", "asess")
                forged = EventAppended(app=A, user="mallory", session="asess", event=text_event("x"))
                for header in (victim.id, dedupe_id(b_subject, victim.id)):  # the old id, and the new one sans digest
                    await nc.jetstream().publish(a_subject, codec.encode(forged), headers={"Nats-Msg-Id": header})
            finally:
                await nc.close()
            b_seq = await b.append("bob", "bsess", victim)
            assert b_seq > a_seq and b.duplicates == 0
            await wait_for(
                lambda: _has(worker.live.engine, B, "bob", "bsess", victim.id), timeout=30, what="B's event in SQL"
            )
        assert (await stored_texts(worker.live.engine, B, "bob", "bsess"))[victim.id] == "B's own words"
        assert (await stored_texts(worker.live.engine, A, "mallory", "asess"))[victim.id] == "A's squatting"


async def test_the_same_id_in_two_apps_and_two_sessions_is_stored_each_time(nats_url, sqlite_url, tmp_path):
    """(c) As ADK's own tests do: fixed event ids reused across apps and sessions."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    places = [(A, "u", "s1"), (A, "u", "s2"), (A, "v", "s1"), (B, "u", "s1")]
    async with running_worker(settings) as worker:
        seqs = []
        for app, user, session in places:
            async with await MemoryClient.connect(nats_url, app=app) as client:
                seqs.append(await client.append(user, session, text_event(f"in {app}/{user}/{session}", id="e-1")))
                assert client.duplicates == 0
        assert len(set(seqs)) == len(places)
        for app, user, session in places:
            await wait_for(
                lambda p=(app, user, session): _has(worker.live.engine, *p, "e-1"), timeout=30, what=str(app)
            )
            assert (await stored_texts(worker.live.engine, app, user, session))["e-1"] == f"in {app}/{user}/{session}"


async def test_a_retry_of_the_same_message_returns_its_sequence(nats_url, sqlite_url, tmp_path):
    """(d) The caller's own retry (same id, same content) is answered as a
    duplicate by JetStream, and is a success with the original sequence."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    event = text_event("said once")
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=A) as client:
            first = await client.append("u", "s", event)
            assert await client.append("u", "s", event) == first  # e.g. after PublishOutcomeUnknown
            assert await client.append_many("u", "s", [event]) == [first]
            assert client.duplicates == 2
            marker = await client.append("u", "s", text_event("after"))
        js = worker.live.js
        await wait_for(lambda: _committed_to(worker.live.engine, "u", "s", 2), timeout=30, what="both events")
        assert (await reads.events(worker.live.engine, A, "u", "s"))[0].seq == first
        assert marker > first and not await dead_letters(js, "duplicate_id")


async def test_the_same_id_with_other_content_is_dead_lettered(nats_url, sqlite_url, tmp_path):
    """(e) The same id with other content in the same session is not a retry:
    JetStream stores it (the digests differ), and the persistence worker keeps
    the first and dead-letters the other with the reason, within the duplicate
    window or after it (another Nats-Msg-Id). The same content after the window
    is a retry: stored once, no dead letter."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    first, other = text_event("first", id="dup-1"), text_event("second", id="dup-1")
    async with running_worker(settings) as worker:
        async with await MemoryClient.connect(nats_url, app=A) as client:
            first_seq = await client.append("u", "s", first)
            other_seq = await client.append("u", "s", other)
            assert other_seq != first_seq and client.duplicates == 0
            # Past the duplicate window (no dedupe): the same two once more.
            nc = await nats.connect(nats_url)
            try:
                for event, header in ((first, "late-1"), (other, "late-2")):
                    message = EventAppended(app=A, user="u", session="s", event=event)
                    await nc.jetstream().publish(
                        codec.subject_for(message), codec.encode(message), headers={"Nats-Msg-Id": header}
                    )
            finally:
                await nc.close()
            # In one batch: a new id twice, with two contents.
            both = await client.append_many("u", "s", [text_event("one", id="dup-2"), text_event("two", id="dup-2")])
        js = worker.live.js
        await wait_for(lambda: _count(dead_letters(js, "duplicate_id"), 3), timeout=30, what="three dead letters")
        letters = await dead_letters(js, "duplicate_id")
        assert sorted(x.original_seq for x in letters) == sorted([other_seq, other_seq + 2, both[1]])
        assert all(x.worker == "persistence" and "already stored in this session" in x.reason for x in letters)
        assert f"at seq {first_seq}" in next(x.reason for x in letters if x.original_seq == other_seq)
        texts = await stored_texts(worker.live.engine, A, "u", "s")
        assert texts == {"dup-1": "first", "dup-2": "one"}


def summarizing_settings(nats_url: str, db_url: str, tmp_path, *, retry_after_s: float):
    """Summaries due after a few long turns, swept and retried quickly."""
    s = make_settings(nats_url, db_url, tmp_path)
    s.memory = type(s.memory).model_validate({**s.memory.model_dump(), "strategy": "summary_buffer", "budget": 2000})
    s.summarizer = type(s.summarizer).model_validate(
        {**s.summarizer.model_dump(), "sweep_interval_s": 0.5, "retry_after_s": retry_after_s, "lease_ttl_s": 3}
    )
    return s


def long_turns() -> list[Event]:
    return [text_event(f"turn {i}: " + " ".join(f"word{i}x{j}" for j in range(120))) for i in range(30)]


class Looks:
    """How often the summarizer announced it was looking at a session."""

    def __init__(self) -> None:
        self.n = 0

    async def heard(self, msg) -> None:
        self.n += orjson.loads(msg.data).get("state") == "summarizing"


async def test_a_predicted_checkpoint_id_does_not_suppress_summaries(nats_url, sqlite_url, tmp_path):
    """(b) A publishes, on its own session, the Nats-Msg-Ids of every
    checkpoint B's session could get (the old scheme's deterministic ids, and
    the new one's without the content digest). B's session is still
    summarized, and the summarizer looks at it a bounded number of times."""
    s, events = summarizing_settings(nats_url, sqlite_url, tmp_path, retry_after_s=0.5), long_turns()
    b_key = scope_key(B, "bob", "bsess")
    b_subject = events_subject(B, "bob", "bsess")
    looks = Looks()

    nc = await nats.connect(nats_url)
    try:
        async with running_worker(s) as worker:
            async with await MemoryClient.connect(nats_url, app=B) as b:
                seqs = await b.append_many("bob", "bsess", events)
            a_subject = events_subject(A, "mallory", "asess")
            tiny = codec.encode(EventAppended(app=A, user="mallory", session="asess", event=text_event(".")))
            for up_to in range(1, seqs[-1] + 1):
                predicted = checkpoint_id(b_key, up_to)
                for header in (predicted, dedupe_id(b_subject, predicted)):
                    await nc.jetstream().publish(a_subject, tiny, headers={"Nats-Msg-Id": header})
            await nc.subscribe(status_subject(B, "bob", "bsess"), cb=looks.heard)
            await bus.settle(nc)  # every look is counted: the summarizer publishes on its own connection
            async with running(SummarizerWorker(s)) as summarizer:
                summarizer.schedule(B, "bob", "bsess")
                await wait_for(lambda: _summarized(worker.live.engine, b_key), timeout=60, what="B's checkpoint in SQL")
                await asyncio.sleep(2)  # a hot loop would go on here
                assert summarizer.stats.failures == 0
            assert looks.n <= 10, f"{looks.n} looks at one session: a retry loop"
    finally:
        await nc.close()


async def test_a_checkpoint_that_does_not_take_is_retried_later_not_at_once(nats_url, sqlite_url, tmp_path):
    """(b, within one app) The app stores checkpoints under every id its
    session's summaries could take (the ids are deterministic, so that SQL
    keeps one per fold across replicas): the summarizer's own checkpoint is
    then skipped by SQL. It notices, and retries after ``retry_after_s``,
    never in a tight loop."""
    s, events = summarizing_settings(nats_url, sqlite_url, tmp_path, retry_after_s=1.0), long_turns()
    key = scope_key(B, "bob", "bsess")
    looks = Looks()

    nc = await nats.connect(nats_url)
    try:
        async with running_worker(s) as worker:
            async with await MemoryClient.connect(nats_url, app=B) as b:
                seqs = await b.append_many("bob", "bsess", events)
                forged = [
                    CheckpointSaved(
                        app=B, user="bob", session="bsess", id=checkpoint_id(key, n), summary="mine", up_to_seq=1
                    )
                    for n in range(1, seqs[-1] + 1)
                ]
                last = max([await b._publish(m) for m in forged])
            await wait_committed(nats_url, last)
            await nc.subscribe(status_subject(B, "bob", "bsess"), cb=looks.heard)
            await bus.settle(nc)  # every look is counted: the summarizer publishes on its own connection
            async with running(SummarizerWorker(s)) as summarizer:
                summarizer.schedule(B, "bob", "bsess")
                await wait_for(lambda: _true(summarizer.stats.failures >= 1), timeout=30, what="a failed look")
                await asyncio.sleep(3)
                assert summarizer.stats.failures <= 6
            assert looks.n <= 10, f"{looks.n} looks at one session: a retry loop"
            async with worker.live.engine.connect() as conn:
                assert (await reads.latest_checkpoint(conn, key)).up_to_seq == 1
    finally:
        await nc.close()


async def _true(value: bool) -> bool:
    return value


async def _has(engine, app: str, user: str, session: str, event_id: str) -> bool:
    return any(e.event_id == event_id for e in await reads.events(engine, app, user, session))


async def _committed_to(engine, user: str, session: str, n: int) -> bool:
    return len(await reads.events(engine, A, user, session)) >= n


async def _count(letters, n: int) -> bool:
    return len(await letters) >= n


async def _summarized(engine, session_key: str) -> bool:
    async with engine.connect() as conn:
        return await reads.latest_checkpoint(conn, session_key) is not None
