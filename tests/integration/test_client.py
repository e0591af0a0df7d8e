"""MemoryClient against a real nats-server (a fresh one per test, from conftest)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import sys
import time
from pathlib import Path

import nats
import pytest
from helpers import event_counts, make_settings, migrated_engine, running_query, running_worker, wait_for
from nats.js.api import DiscardPolicy, StreamConfig

from memq.contracts import client as memq_client_module
from memq.contracts.client import MemoryClient, SessionRef
from memq.contracts.codec import decode_from_subject, msg_id
from memq.contracts.errors import (
    Conflict,
    InvalidId,
    InvalidMessage,
    InvalidRequest,
    NotFound,
    Oversize,
    PublishFailed,
    PublishOutcomeUnknown,
    WrongEventLoop,
)
from memq.contracts.schemas import ArtifactSaved, Event, Message, TextPart
from memq.contracts.subjects import ARTIFACT_BUCKET, EVENTS_STREAM, artifact_object_name, dedupe_id, events_subject
from memq.workers.runtime.bus import ensure_streams
from memq.workers.settings import StreamSettings
from memq.workers.sql import reads

APP = "agent.one"  # a dot, so subjects must use the encoded token
USER = "ada@example.com"
SESSION = "session 1"


@pytest.fixture
async def nc(nats_url: str):
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


@pytest.fixture
async def client(nc) -> MemoryClient:
    await ensure_streams(nc.jetstream(), StreamSettings())
    return MemoryClient(nc, APP)


async def stored(nc, seq: int):
    """The message at ``seq``, decoded and checked against its subject."""
    raw = await nc.jetstream().get_msg(EVENTS_STREAM, seq)
    return decode_from_subject(raw.subject, raw.data), raw


async def message_count(nc) -> int:
    return (await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages


def text_event(text: str) -> Event:
    return Event(message=Message(role="user", parts=[TextPart(text=text)]))


async def test_append_returns_increasing_sequences(client: MemoryClient, nc) -> None:
    ref = await client.create_session(USER, SESSION, state={"topic": "x"})
    assert ref == SessionRef(APP, USER, SESSION, ref.seq)
    seqs = [await client.append(USER, SESSION, text_event(f"turn {i}")) for i in range(5)]
    seqs.append(await client.append_text(USER, SESSION, "assistant", "reply"))
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] > ref.seq
    message, raw = await stored(nc, seqs[-1])
    assert raw.subject == events_subject(APP, USER, SESSION)
    assert message.event.message.text == "reply" and message.event.author == APP
    assert raw.headers["Nats-Msg-Id"] == msg_id(message) == dedupe_id(raw.subject, message.event.id, raw.data)


async def test_append_many_keeps_input_order(client: MemoryClient, nc) -> None:
    events = [text_event(f"turn {i}") for i in range(5000)]
    seqs = await client.append_many(USER, SESSION, events)
    assert len(seqs) == 5000 and seqs == sorted(seqs) and len(set(seqs)) == 5000
    assert await message_count(nc) == 5000
    for event, seq in zip(events, seqs):
        message, _ = await stored(nc, seq)
        assert message.event == event
    assert await client.append_many(USER, SESSION, []) == []


async def test_republishing_an_event_returns_its_sequence(client: MemoryClient, nc) -> None:
    first, second = text_event("once"), text_event("twice")
    seq = await client.append(USER, SESSION, first)
    assert await client.append(USER, SESSION, first) == seq
    # The pipelined path is deduplicated too, and keeps the original order.
    seqs = await client.append_many(USER, SESSION, [first, second, first, second])
    assert seqs[0] == seqs[2] == seq and seqs[1] == seqs[3] > seq
    assert await message_count(nc) == 2
    # At the JetStream level: the PubAck of a republish says duplicate.
    _, raw = await stored(nc, seq)
    ack = await nc.jetstream().publish(raw.subject, raw.data, headers={"Nats-Msg-Id": raw.headers["Nats-Msg-Id"]})
    assert ack.duplicate and ack.seq == seq
    assert client.duplicates == 4  # each republish by the client was answered as a duplicate, and succeeded


# A writer in its own OS process, with its own NATS connection: appends one
# event with expect_seq (argv) and prints its seq, or "conflict <last_seq>".
STALE_WRITER = """
import asyncio, sys
from memq.contracts.client import MemoryClient
from memq.contracts.errors import Conflict

async def main(url, app, user, session, expect_seq):
    async with await MemoryClient.connect(url, app=app) as client:
        try:
            print(await client.append_text(user, session, "user", "from B", expect_seq=int(expect_seq)))
        except Conflict as exc:
            print("conflict", exc.last_seq)

asyncio.run(main(*sys.argv[1:]))
"""


async def in_another_process(*args: object) -> str:
    # The child imports memq from where this process does.
    where = str(Path(memq_client_module.__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")]))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STALE_WRITER, *map(str, args), stdout=asyncio.subprocess.PIPE, env=env
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    return out.decode().strip()


async def test_a_stale_append_from_another_process_is_a_conflict(client: MemoryClient, nats_url: str) -> None:
    ref = await client.create_session(USER, SESSION)  # both writers loaded the session here
    mine = await client.append(USER, SESSION, text_event("from A"), expect_seq=ref.seq)
    # B, in its own process, still expects the session to end at its creation.
    assert await in_another_process(nats_url, APP, USER, SESSION, ref.seq) == f"conflict {mine}"
    # Reloaded (it ends at A's append now), B goes through.
    theirs = int(await in_another_process(nats_url, APP, USER, SESSION, mine))
    assert theirs > mine
    with pytest.raises(Conflict, match="another writer appended to the session first") as refused:
        await client.append_text(USER, SESSION, "user", "stale A", expect_seq=mine)
    assert refused.value.last_seq == theirs and refused.value.code == "conflict"


async def test_expect_seq_counts_every_kind_of_message_on_the_session(client: MemoryClient, nc) -> None:
    # 0: a session subject without any message yet.
    first = await client.append(USER, SESSION, text_event("first"), expect_seq=0)
    with pytest.raises(Conflict) as refused:
        await client.append(USER, SESSION, text_event("also first"), expect_seq=0)
    assert refused.value.last_seq == first
    # A state set on the session (as a checkpoint or an artifact) is its last message too.
    state = await client.set_state(USER, {"topic": 1}, session=SESSION)
    with pytest.raises(Conflict) as refused:
        await client.append(USER, SESSION, text_event("after first"), expect_seq=first)
    assert refused.value.last_seq == state
    # Messages of other sessions or of the user alone do not count.
    await client.append(USER, "another session", text_event("elsewhere"))
    await client.set_state(USER, {"user:lang": "fr"})
    after = await client.append(USER, SESSION, text_event("after state"), expect_seq=state)
    # append_many: the first event carries it; if refused, nothing is published.
    count = await message_count(nc)
    with pytest.raises(Conflict):
        await client.append_many(USER, SESSION, [text_event("a"), text_event("b")], expect_seq=state)
    assert await message_count(nc) == count
    seqs = await client.append_many(USER, SESSION, [text_event("a"), text_event("b")], expect_seq=after)
    assert len(seqs) == 2 and seqs[0] > after
    with pytest.raises(InvalidRequest):
        await client.append(USER, SESSION, text_event("x"), expect_seq=-1)


async def test_a_repeated_publish_with_expect_seq_is_refused_not_deduplicated(client: MemoryClient) -> None:
    """nats-server (2.15) checks the expected sequence before the Nats-Msg-Id
    dedupe: a retry of a stored publish gets Conflict naming its own seq."""
    ref = await client.create_session(USER, SESSION)
    event = text_event("once")
    seq = await client.append(USER, SESSION, event, expect_seq=ref.seq)
    with pytest.raises(Conflict) as refused:
        await client.append(USER, SESSION, event, expect_seq=ref.seq)
    assert refused.value.last_seq == seq
    assert await client.append(USER, SESSION, event) == seq  # without it: the duplicate's ack
    assert await client.append(USER, SESSION, event, expect_seq=seq) == seq  # or with the current one


async def test_small_artifact_goes_inline(client: MemoryClient, nc) -> None:
    data = os.urandom(client.inline_artifact_limit)
    seq = await client.save_artifact(USER, SESSION, "notes.bin", data, mime_type="application/x-test")
    message, _ = await stored(nc, seq)
    assert isinstance(message, ArtifactSaved)
    assert message.inline == data and message.object is None and message.mime_type == "application/x-test"


async def test_large_artifact_goes_through_the_object_store(client: MemoryClient, nc) -> None:
    data = os.urandom(64 * 1024 * 1024)
    seq = await client.save_artifact(USER, SESSION, "model.bin", data)
    message, raw = await stored(nc, seq)
    assert message.inline is None and len(raw.data) < 2048
    ref = message.object
    assert ref.bucket == ARTIFACT_BUCKET
    assert ref.name == artifact_object_name(APP, USER, SESSION, message.id)
    assert ref.size == len(data) and ref.sha256 == hashlib.sha256(data).hexdigest()
    # writeinto: without it nats-py concatenates bytes per chunk (quadratic, ~10 s here).
    buffer = io.BytesIO()
    await (await nc.jetstream().object_store(ARTIFACT_BUCKET)).get(ref.name, writeinto=buffer)
    assert hashlib.sha256(buffer.getvalue()).hexdigest() == ref.sha256


async def test_oversize_raises_before_publishing(client: MemoryClient, nc) -> None:
    await client.append_text(USER, SESSION, "user", "small")
    with pytest.raises(Oversize, match="limit is 1047552"):  # 1 MiB minus room for the headers
        await client.append_text(USER, SESSION, "user", "x" * (1024 * 1024))
    # Payload + headers over the server's max_payload would cost the connection.
    with pytest.raises(Oversize):
        await client.append_text(USER, SESSION, "user", "x" * (1024 * 1024 - 600))
    assert nc.is_connected
    with pytest.raises(Oversize):  # one oversize event stops the whole batch before any publish
        await client.append_many(USER, SESSION, [text_event("fine"), text_event("x" * (2 * 1024 * 1024))])
    strict = MemoryClient(nc, APP, max_message_bytes=600, inline_artifact_limit=1024)
    with pytest.raises(Oversize):
        await strict.save_artifact(USER, SESSION, "a.bin", b"x" * 1024)
    assert await message_count(nc) == 1


async def test_missing_stream_is_a_clear_publish_failure(nc) -> None:
    client = MemoryClient(nc, APP, timeout=2.0)  # no ensure_streams: nothing exists
    for publish in (
        client.append_text(USER, SESSION, "user", "hi"),
        client.append_many(USER, SESSION, [text_event("a"), text_event("b")]),
        client.set_state(USER, {"user:lang": "fr"}),
        client.delete_user(USER, missing_ok=True),  # published unasked: no query service here
    ):
        with pytest.raises(
            PublishFailed, match=r"no stream captures it \(MEMQ_EVENTS or MEMQ_EVENTS_\S+\): run `memq init`"
        ):
            await publish
    with pytest.raises(PublishFailed, match=f"bucket {ARTIFACT_BUCKET} not found"):
        await client.save_artifact(USER, SESSION, "big.bin", b"x" * (client.inline_artifact_limit + 1))


async def test_a_subject_captured_by_another_stream_is_refused(nc) -> None:
    await nc.jetstream().add_stream(StreamConfig(name="SOMETHING_ELSE", subjects=["memq.>"]))
    client = MemoryClient(nc, APP, timeout=2.0)
    with pytest.raises(PublishFailed, match="not captured by stream MEMQ_EVENTS"):
        await client.append_text(USER, SESSION, "user", "hi")
    with pytest.raises(PublishFailed, match="not captured by stream MEMQ_EVENTS"):
        await client.append_many(USER, SESSION, [text_event("a"), text_event("b")])


async def test_every_write_lands_on_its_subject(client: MemoryClient, nc) -> None:
    ref = await client.create_session(USER)
    user_subject, session_subject = events_subject(APP, USER), events_subject(APP, USER, ref.session)
    writes = [
        (ref.seq, "session.create", session_subject),
        (await client.set_state(USER, {"user:lang": "fr"}), "state.set", user_subject),
        (await client.set_state(USER, {"topic": 1}, session=ref.session), "state.set", session_subject),
        (await client.delete_session(USER, ref.session, missing_ok=True), "session.delete", session_subject),
        (await client.delete_user(USER, missing_ok=True), "user.delete", user_subject),
    ]
    for seq, kind, subject in writes:
        message, raw = await stored(nc, seq)
        assert (message.kind, raw.subject) == (kind, subject)
        assert raw.headers["Nats-Msg-Id"] == msg_id(message) == dedupe_id(raw.subject, message.id, raw.data)


async def test_a_missing_session_or_user_is_not_found_unless_asked_to_create(nats_url, sqlite_url, tmp_path, nc):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings):
        client = MemoryClient(nc, APP)
        last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
        with pytest.raises(NotFound, match="no session 'typo' of user .*: nothing appended"):
            await client.append_text(USER, "typo", "user", "hi", create=False)
        with pytest.raises(NotFound, match="nothing appended"):
            await client.append_many(USER, "typo", [text_event("a"), text_event("b")], create=False)
        with pytest.raises(NotFound, match="no session 'typo' of user .*: nothing deleted"):
            await client.delete_session(USER, "typo")
        with pytest.raises(NotFound, match="no user 'nobody' .*: nothing deleted"):
            await client.delete_user("nobody")
        assert (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq == last  # nothing published

        await client.append_text(USER, "chat", "user", "hi")  # the default: the first event starts it
        await client.append_text(USER, "chat", "user", "again", create=False)
        await client.create_session(USER, "empty")  # created, without events: it exists
        await client.append_many(USER, "empty", [text_event("first")], create=False)
        # Another client's session (another connection): its acknowledged writes count.
        async with await MemoryClient.connect(nats_url, app=APP) as other:
            await other.create_session(USER, "theirs")
        await client.append_text(USER, "theirs", "user", "hello", create=False)

        await client.delete_session(USER, "chat")
        with pytest.raises(NotFound, match="nothing appended"):
            await client.append_text(USER, "chat", "user", "still there?", create=False)
        with pytest.raises(NotFound, match="nothing deleted"):
            await client.delete_session(USER, "chat")
        await client.delete_session(USER, "chat", missing_ok=True)  # asked to: published unasked

        await client.set_user_state("carol", {"lang": "fr"})  # the user's own state: a user to delete
        await client.delete_user("carol")


async def test_user_state_takes_keys_without_a_prefix(client: MemoryClient, nc) -> None:
    seq = await client.set_user_state(USER, {"lang": "fr", "user:tz": "CET", "app:x": 1})
    message, _ = await stored(nc, seq)
    assert message.delta == {"user:lang": "fr", "user:tz": "CET", "app:x": 1} and message.session is None
    message, _ = await stored(nc, await client.delete_user_state(USER, ["lang", "user:tz"]))
    assert message.delete == ["user:lang", "user:tz"]
    with pytest.raises(InvalidMessage, match=r"with and without the user: prefix: \['lang'\]"):
        await client.set_user_state(USER, {"lang": "fr", "user:lang": "en"})
    with pytest.raises(InvalidMessage, match="need a session .*user: prefix"):  # set_state stays strict
        await client.set_state(USER, {"lang": "fr"})


async def test_bad_input_fails_before_any_io(nats_url: str) -> None:
    conn = await nats.connect(nats_url)
    await conn.close()  # any publish would now fail with a connection error
    client = MemoryClient(conn, APP)
    bad_ids = ["", "x" * 257, "\ud800", None]
    for bad in bad_ids:
        with pytest.raises(InvalidId):
            await client.append_text(bad, SESSION, "user", "hi")
        with pytest.raises(InvalidId):
            await client.append_many(USER, bad, [text_event("a")])
        with pytest.raises(InvalidId):
            await client.save_artifact(USER, bad, "big.bin", b"x" * (client.inline_artifact_limit + 1))
        with pytest.raises(InvalidId):
            await client.create_session(bad, "session")
        with pytest.raises(InvalidId):
            await client.delete_user(bad)
        with pytest.raises(InvalidId):
            MemoryClient(conn, bad)
    with pytest.raises(InvalidMessage, match="need a session"):
        await client.set_state(USER, {"topic": 1})
    with pytest.raises(InvalidMessage, match="filename"):
        await client.save_artifact(USER, SESSION, "", b"x")
    with pytest.raises(InvalidId):  # checked before connecting: nothing listens on port 1
        await MemoryClient.connect("nats://127.0.0.1:1", app="x" * 300)
    with pytest.raises(PublishFailed):  # and the same call with good ids does reach the connection
        await client.append_text(USER, SESSION, "user", "hi")


async def test_connect_owns_and_closes_its_connection(nats_url: str) -> None:
    async with await MemoryClient.connect(nats_url, app=APP) as client:
        assert client.nc.is_connected
    assert client.nc.is_closed


async def test_connect_to_a_dead_nats_fails_fast_with_one_clear_error(caplog) -> None:
    """Issue 11: nats-py's first connect looped 60 times (122 s), a traceback each."""
    import logging
    import time

    from services import free_port

    from memq.contracts.errors import Unavailable

    url = f"nats://agent:s3cret@127.0.0.1:{free_port()}"  # nobody listens there
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG), pytest.raises(Unavailable) as caught:
        await MemoryClient.connect(url, app=APP)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert f"cannot reach NATS at {url.replace('s3cret', '***')}" in message and "s3cret" not in message
    assert not [r for r in caplog.records if r.exc_info], "no traceback per connect attempt"


async def test_connect_rides_out_a_nats_restart_once_connected(fresh_nats) -> None:
    """Failing fast applies to the first connect only: afterwards the client
    reconnects (max_reconnect_attempts, here forever) as nats-py does."""
    async with await MemoryClient.connect(
        fresh_nats.url, app=APP, max_reconnect_attempts=-1, reconnect_time_wait=0.2
    ) as client:
        assert client.nc.options["max_reconnect_attempts"] == -1
        await ensure_streams(client.nc.jetstream(), StreamSettings())
        fresh_nats.restart()

        async def appended() -> bool:  # JetStream may still be recovering its streams
            return await client.append(USER, SESSION, text_event("after the restart")) >= 1

        await wait_for(appended, 30, "a publish after the restart")
        assert client.nc.stats["reconnects"] >= 1


# --- a publish whose outcome is unknown is settled by the client ------------------


async def copies_seen(nc, sub) -> int:
    """How many messages ``sub`` (a core subscription of ``nc`` on events
    subjects) got: every try of a publish that reached the server."""
    await nc.flush()
    return sub.pending_msgs


async def test_a_publish_acked_too_late_is_settled_with_its_original_sequence(fresh_nats, nc) -> None:
    """The server stalls: the first try is stored once it wakes, but its ack
    comes after the try gave up. The client publishes the same message again
    and gets the original sequence back (a duplicate): one copy stored."""
    await ensure_streams(nc.jetstream(), StreamSettings())
    client = MemoryClient(nc, APP, timeout=0.3)
    tries = await nc.subscribe(events_subject(APP, USER, SESSION))
    event = text_event("once")
    sent = 0
    publish = client._js.publish

    async def counted(*args, **kwargs):
        nonlocal sent
        sent += 1
        return await publish(*args, **kwargs)

    client._js.publish = counted  # type: ignore[method-assign]
    fresh_nats.pause()
    try:
        publishing = asyncio.create_task(client.append(USER, SESSION, event))
        # Until the try after the first has gone to the stalled server (a
        # fixed second was too short on a loaded CI machine).
        await wait_for(lambda: _true(sent >= 2), timeout=30, what="a second try")
    finally:
        fresh_nats.resume()
    seq = await publishing
    assert await copies_seen(nc, tries) >= 2  # it was tried again
    assert await message_count(nc) == 1 and client.last_seq == seq
    message, _ = await stored(nc, seq)
    assert message.event == event


async def test_an_append_many_chunk_acked_too_late_is_settled_in_order(fresh_nats, nc) -> None:
    """The same for the pipelined chunk of append_many: the server stalls once
    the chunk is under way; its unacknowledged events are published again
    (same ids), each is stored once, and as nothing was lost, in order."""
    await ensure_streams(nc.jetstream(), StreamSettings())
    client = MemoryClient(nc, APP, timeout=0.3)
    events = [text_event(f"turn {i} " + "x" * 1000) for i in range(300)]
    stalled = asyncio.Event()

    # events[0] is published alone, then the chunk, whose first is awaited
    # before the rest go. This runs before the client sees events[1]'s ack
    # (the server delivers to a subscriber before it acks, on one connection
    # here), so the rest of the chunk goes to a stalled server.
    async def stall_on_the_chunk(msg) -> None:
        if msg.headers["Nats-Msg-Id"].split(".")[1] == events[1].id:
            fresh_nats.pause()
            stalled.set()

    watcher = await nc.subscribe(events_subject(APP, USER, SESSION), cb=stall_on_the_chunk)
    tries = await nc.subscribe(events_subject(APP, USER, SESSION))
    publishing = asyncio.create_task(client.append_many(USER, SESSION, events))
    try:
        await asyncio.wait_for(stalled.wait(), 10)
        await asyncio.sleep(1.0)
    finally:
        fresh_nats.resume()
    seqs = await publishing
    await watcher.unsubscribe()
    assert await copies_seen(nc, tries) > len(events)  # some were tried again
    assert await message_count(nc) == len(events)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(events)
    for event, seq in zip(events[::50], seqs[::50]):
        assert (await stored(nc, seq))[0].event == event


async def test_no_stream_answering_a_client_it_acked_is_waited_out(nc) -> None:
    """No responders from a stream that has acked this client is a failover
    or a recovery, not a missing stream: tried again until it answers."""
    js = nc.jetstream()
    await ensure_streams(js, StreamSettings())
    client = MemoryClient(nc, APP)
    await client.append_text(USER, SESSION, "user", "before")
    await js.delete_stream(EVENTS_STREAM)
    publishing = asyncio.create_task(client.append_text(USER, SESSION, "user", "after"))
    await asyncio.sleep(0.5)
    assert not publishing.done()
    await ensure_streams(js, StreamSettings())
    assert await publishing == 1  # the stream's first, as it is a new one


async def test_a_nats_crash_mid_publish_stores_every_event_exactly_once(fresh_nats, sqlite_url, tmp_path) -> None:
    """Issue 26's Done-means: nats-server is killed (SIGKILL) while a client
    appends one event at a time and in pipelined batches, and restarted on the
    same port and store. Every append returns a sequence (after
    PublishOutcomeUnknown the same event is retried, as the guide says), and
    SQL holds each event once: the one-at-a-time session in input order, the
    batches in the order of the sequences returned."""
    settings = make_settings(fresh_nats.url, sqlite_url, tmp_path)
    engine = await migrated_engine(sqlite_url)
    singles = [text_event(f"single {i}") for i in range(400)]
    batches: list[list[Event]] = []
    done: list[int] = []
    batch_seqs: list[int] = []

    async def settled(publish):
        while True:
            try:
                return await publish()
            except PublishOutcomeUnknown:  # the documented answer: the same event(s) again
                pass

    async def one_at_a_time(client: MemoryClient) -> None:
        for event in singles:
            done.append(await settled(lambda e=event: client.append(USER, "singles", e)))

    async def in_batches(client: MemoryClient) -> None:  # as long as the other writer
        while len(done) < len(singles):
            batches.append([text_event(f"batch {len(batches)} event {i}") for i in range(200)])
            batch_seqs.extend(await settled(lambda b=batches[-1]: client.append_many(USER, "batches", b)))

    try:
        async with running_worker(settings):
            async with await MemoryClient.connect(
                fresh_nats.url, app=APP, timeout=1.0, max_reconnect_attempts=-1, reconnect_time_wait=0.1
            ) as client:
                writers = asyncio.gather(one_at_a_time(client), in_batches(client))

                async def under_way() -> bool:
                    return len(done) >= 100

                await wait_for(under_way, 60, "a hundred appends")
                fresh_nats.kill()  # mid-stream: appends and a batch are in flight
                killed_at = len(done)
                await asyncio.sleep(2.0)  # longer than a try (timeout): tries time out meanwhile
                await asyncio.to_thread(fresh_nats.start)  # same port, same store dir
                await asyncio.wait_for(writers, 120)
            assert killed_at < len(singles) and client.nc.stats["reconnects"] >= 1

            total = len(singles) + len(batch_seqs)

            async def all_committed() -> bool:
                rows, distinct = await event_counts(engine)
                assert rows == distinct, f"{rows - distinct} duplicate rows"
                return rows == total

            await wait_for(all_committed, 60, "every event in SQL")
        assert len(done) == len(singles) and len(batch_seqs) == sum(map(len, batches))
        assert [e.event_id for e in await reads.events(engine, APP, USER, "singles")] == [e.id for e in singles]
        by_seq = [event.id for _, event in sorted(zip(batch_seqs, [e for b in batches for e in b]))]
        assert [e.event_id for e in await reads.events(engine, APP, USER, "batches")] == by_seq
    finally:
        await engine.dispose()


async def test_a_definite_refusal_raises_at_once_without_a_retry(nats_url, nc) -> None:
    """No retry where the answer is final: a subject another stream captures,
    a full stream (a JetStream 503 that is no outage), a missing stream."""
    js = nc.jetstream()
    client = MemoryClient(nc, APP, timeout=2.0, publish_deadline=30.0)
    started = time.monotonic()
    with pytest.raises(PublishFailed, match=r"no stream captures it \(MEMQ_EVENTS or MEMQ_EVENTS_\S+\)") as missing:
        await client.append_text(USER, SESSION, "user", "hi")
    # After that check: a subscriber is a responder, so no "no responders" then.
    tries = await nc.subscribe(events_subject(APP, USER) + ".>")
    await js.add_stream(StreamConfig(name="SOMETHING_ELSE", subjects=[events_subject(APP, USER, "elsewhere")]))
    with pytest.raises(PublishFailed, match="not captured by stream MEMQ_EVENTS") as elsewhere:
        await client.append_many(USER, "elsewhere", [text_event("a"), text_event("b")])
    full = StreamConfig(
        name=EVENTS_STREAM, subjects=[events_subject(APP, USER, SESSION)], max_msgs=1, discard=DiscardPolicy.NEW
    )
    await js.add_stream(full)
    await client.append_text(USER, SESSION, "user", "fits")
    with pytest.raises(PublishFailed, match="maximum messages exceeded") as overflow:
        await client.append_text(USER, SESSION, "user", "does not fit")
    # A retry of any of them would take a try's timeout (2 s) at least, the
    # missing stream's until the publish deadline (30 s); the one try each is
    # counted below. Two stream creations alone can take a loaded CI machine
    # past a second, so the bound is well above that and well below 30 s.
    assert time.monotonic() - started < 10
    for raised in (missing, elsewhere, overflow):
        assert not isinstance(raised.value, PublishOutcomeUnknown)
    # one try each, and the one that fit; the subject in another stream is tried
    # expecting each of the two names the app's events stream can have
    assert await copies_seen(nc, tries) == 4


async def test_a_call_from_another_event_loop_is_refused_at_once_and_its_own_loop_still_works(nats_url: str) -> None:
    # As the Agents SDK's Runner.run_sync in a thread calls a session: without
    # the check, the request waited out its timeout and said no service answered.
    async with await MemoryClient.connect(nats_url, app=APP) as client:
        await ensure_streams(client.nc.jetstream(), StreamSettings())

        def from_another_loop() -> float:
            started = time.monotonic()
            with pytest.raises(WrongEventLoop, match="another event loop"):
                asyncio.run(client.append_text("u", "s", "user", "hello"))
            return time.monotonic() - started

        assert await asyncio.to_thread(from_another_loop) < 1.0
        assert await client.append_text("u", "s", "user", "hello") >= 1  # its own loop is served as before


async def _true(value: bool) -> bool:
    return value
