"""Per-app security at the broker, against a real nats-server started from the
accounts config that `memq nats accounts` writes (memq.workers.security).

Every worker kind runs as the ``workers`` user; apps A and B have their own
users. A works end to end; B can touch nothing of A's (publish, request,
subscribe, JetStream API), and still does its own work. A violation is
asserted on the server's own "Permissions Violation" error, not on the mere
absence of data.
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import nats
import nats.errors
import orjson
import pytest
from helpers import make_settings, running, wait_for
from nats.js.errors import NotFoundError
from pydantic import SecretStr
from services import NatsServer
from services import running as running_service

from memq.contracts.client import MemoryClient, app_inbox_prefix, build_request, encode_request, parse_reply
from memq.contracts.errors import Forbidden, NotFound, PublishFailed
from memq.contracts.subjects import events_subject, request_subject, status_subject
from memq.workers import security
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.memory.facts import Change, Fact, Source, fact_id
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.query.worker import QueryWorker
from memq.workers.runtime import bus
from memq.workers.sql import facts as facts_store
from memq.workers.sql.engine import create_engine
from memq.workers.status import collect_status
from memq.workers.summarizer.worker import SummarizerWorker

pytestmark = pytest.mark.timeout(300)

A, B = "app-a", "team.b"  # B's id needs escaping in subjects: the encoding is part of the fence
VIOLATION = "(?i)permissions violation"


@dataclass
class Secured:
    server: NatsServer
    passwords: dict[str, str]
    settings: object


@dataclass
class Errors:
    seen: list[str] = field(default_factory=list)

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    async def wait(self, text: str, timeout: float = 5.0) -> str:
        # nats-py lower-cases the server's "Permissions Violation for Publish to ..."
        async def found() -> bool:
            return any(text.lower() in e.lower() for e in self.seen)

        await wait_for(found, timeout, f"an async error containing {text!r} (got {self.seen})")
        return next(e for e in self.seen if text.lower() in e.lower())


@pytest.fixture(scope="module")
async def secured(tmp_path_factory):
    names = security.user_names([A, B])
    passwords, hashed = security.generate_passwords(names)
    memq_users, system_users = security.build_users([A, B], hashed)
    config = security.render_accounts(memq_users, system_users)
    tmp = tmp_path_factory.mktemp("secured")
    with running_service(functools.partial(NatsServer, config=config)) as server:
        s = make_settings(server.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        s.nats = s.nats.model_copy(update={"user": "workers", "password": SecretStr(passwords["workers"])})
        s.summarizer = s.summarizer.model_copy(update={"sweep_interval_s": 0.5})
        s.query = s.query.model_copy(update={"apps": {A: {"strategy": "summary_buffer", "budget": 150}}})
        async with AsyncExitStack() as stack:
            indexing = IndexingWorker(s)
            for worker in (PersistenceWorker(s), QueryWorker(s), SummarizerWorker(s), indexing):
                await stack.enter_async_context(running(worker))
            await asyncio.wait_for(indexing.ready.wait(), 120)  # its consumer exists once the model is loaded
            yield Secured(server, passwords, s)


async def connect_as(secured: Secured, user: str, errors: Errors | None = None, **options) -> nats.NATS:
    return await nats.connect(
        secured.server.url,
        user=user,
        password=secured.passwords[user],
        error_cb=(errors or Errors()).record,
        max_reconnect_attempts=0,
        **options,
    )


async def app_client(secured: Secured, app: str, errors: Errors | None = None, **kw) -> MemoryClient:
    user = security.app_user_name(app)
    return await MemoryClient.connect(
        secured.server.url,
        app=app,
        user=user,
        password=secured.passwords[user],
        error_cb=(errors or Errors()).record,
        max_reconnect_attempts=0,
        **kw,
    )


async def test_an_app_works_end_to_end_with_its_own_credentials(secured):
    async with await app_client(secured, A) as a:
        ref = await a.create_session("alice", "s1", state={"user:lang": "fr"})
        await a.append_text("alice", "s1", "user", "I booked a flight to Lisbon for May 3rd")
        await a.append_text("alice", "s1", "assistant", "Noted: Lisbon on May 3rd.")
        await a.save_artifact("alice", "s1", "notes.txt", b"inline is allowed")
        history = await a.history("alice", "s1")
        assert [e.event["message"]["parts"][0]["text"] for e in history.events][-1] == "Noted: Lisbon on May 3rd."
        context = await a.context("alice", "s1", format="openai")
        assert context.messages[-1]["content"] == "Noted: Lisbon on May 3rd."
        assert (await a.get_session("alice", "s1")).state["user:lang"] == "fr"
        assert await a.get_artifact("alice", "s1", "notes.txt") == b"inline is allowed"
        assert ref.seq >= 1
        # Over budget: the summarizer (lease in KV, checkpoint onto the stream) runs as `workers`.
        for i in range(12):
            await a.append_text(
                "alice", "long", "user", f"Turn {i}: my sister Ana lives in Porto and sails on weekends."
            )

        async def summarized() -> bool:
            return (await a.history("alice", "long")).summary is not None

        try:
            await wait_for(summarized, 60, "a summary checkpoint")
        except AssertionError:  # a permission the workers lack shows here
            print("\n".join(line for line in secured.server.log_path.read_text().splitlines() if "Violation" in line))
            raise
        # status notices of its own sessions reach it
        seen = []

        async def watch():
            async for notice in a.watch_status("alice", "s1"):
                seen.append(notice)
                return

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)  # the watcher has subscribed on a's connection...
        await bus.settle(a.nc)  # ...and the server holds it before another connection publishes
        workers = await connect_as(secured, "workers")
        await workers.publish(status_subject(A, "alice", "s1"), orjson.dumps({"state": "summarizing"}))
        await asyncio.wait_for(watcher, 5)
        await workers.close()
        assert seen == [{"state": "summarizing"}]


async def test_b_cannot_write_into_a(secured):
    errors = Errors()
    b_nc = await connect_as(secured, security.app_user_name(B), errors, inbox_prefix=app_inbox_prefix(B))
    try:
        as_a = MemoryClient(b_nc, A, timeout=1.0)  # B's connection, A's subjects
        with pytest.raises(Forbidden, match=VIOLATION) as refused:
            await as_a.append_text("alice", "s1", "user", "injected by B")
        assert f'"{events_subject(A, "alice", "s1")}"' in str(refused.value)
        await errors.wait(f'Publish to "{events_subject(A, "alice", "s1")}"')
        with pytest.raises(Forbidden, match=VIOLATION):
            await as_a.delete_user("alice", missing_ok=True)  # the publish itself is refused
    finally:
        await b_nc.close()
    async with await app_client(secured, A) as a:
        texts = [e.event["message"]["parts"][0]["text"] for e in (await a.history("alice", "s1")).events]
        assert "injected by B" not in texts and texts  # A's session is intact


async def test_b_cannot_read_a_through_the_query_service(secured):
    errors = Errors()
    b_nc = await connect_as(secured, security.app_user_name(B), errors, inbox_prefix=app_inbox_prefix(B))
    try:
        as_a = MemoryClient(b_nc, A, timeout=1.0, consistent=False, wait_ms=0)
        with pytest.raises(Forbidden, match=VIOLATION):
            await as_a.history("alice", "s1")
        await errors.wait(f'Publish to "{request_subject(A, "history")}"')
        # B's own subject with a body that names A: the query worker refuses it.
        request = build_request(A, "history", user="alice", session="s1")
        reply = await b_nc.request(request_subject(B, "history"), encode_request(request), timeout=5)
        with pytest.raises(Forbidden, match="sent on a subject of app"):
            parse_reply("history", reply.data)
    finally:
        await b_nc.close()


async def test_b_cannot_listen_to_a(secured):
    errors = Errors()
    b_nc = await connect_as(secured, security.app_user_name(B), errors, inbox_prefix=app_inbox_prefix(B))
    received = []

    async def got(msg) -> None:
        received.append(msg.subject)

    try:
        for subject in (
            f"memq.v1.ev.{A}.>",
            f"memq.v1.status.{A}.>",
            f"{app_inbox_prefix(A)}.>",
            "_INBOX.>",
            "memq.v1.changed.>",
            ">",
        ):
            await b_nc.subscribe(subject, cb=got)
            await errors.wait(f'Subscription to "{subject}"')
        async with await app_client(secured, A) as a:
            await a.append_text("alice", "s1", "user", "private to A")  # an event, its PubAck on A's inbox
            await a.history("alice", "s1")  # a reply on A's inbox, a change notice
        workers = await connect_as(secured, "workers")
        await workers.publish(status_subject(A, "alice", "s1"), b'{"state": "summarizing"}')
        await workers.flush()
        await workers.close()
        await asyncio.sleep(0.5)
        assert received == []
    finally:
        await b_nc.close()


async def test_b_has_no_jetstream_api(secured):
    errors = Errors()
    b_nc = await connect_as(secured, security.app_user_name(B), errors, inbox_prefix=app_inbox_prefix(B))
    js = b_nc.jetstream(timeout=1.0)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await js.stream_info("MEMQ_EVENTS")
        await errors.wait('Publish to "$JS.API.STREAM.INFO.MEMQ_EVENTS"')
        with pytest.raises(nats.errors.TimeoutError):  # a consumer would read every app's events
            await js.add_consumer("MEMQ_EVENTS", durable_name="steal", filter_subject=f"memq.v1.ev.{A}.>")
        await errors.wait('Publish to "$JS.API.CONSUMER.DURABLE.CREATE.MEMQ_EVENTS.steal"')
        with pytest.raises(nats.errors.TimeoutError):
            await js.pull_subscribe(f"memq.v1.ev.{A}.>", durable="memq-persistence", stream="MEMQ_EVENTS")
        await errors.wait('Publish to "$JS.API.CONSUMER.INFO.MEMQ_EVENTS.memq-persistence"')
        with pytest.raises(nats.errors.TimeoutError):
            await js.object_store("MEMQ_ARTIFACTS")
    finally:
        await b_nc.close()
    # ... so large artifacts (object store) are refused with a clear error.
    async with await app_client(secured, B, timeout=1.0, inline_artifact_limit=16) as b:
        with pytest.raises(PublishFailed, match="inline_artifact_limit"):
            await b.save_artifact("bob", "s1", "big.bin", b"x" * 1000)


async def test_an_app_user_must_use_its_own_inbox(secured):
    errors = Errors()
    b_nc = await connect_as(secured, security.app_user_name(B), errors)  # default _INBOX prefix
    try:
        with pytest.raises(Forbidden, match=VIOLATION):
            await MemoryClient(b_nc, B, timeout=1.0).append_text("bob", "no-inbox", "user", "hi")
        await errors.wait('Subscription to "_INBOX.')
    finally:
        await b_nc.close()


async def test_b_keeps_working_on_its_own_data(secured):
    async with await app_client(secured, B) as b:
        await b.append_text("bob", "s1", "user", "B's own note")
        history = await b.history("bob", "s1")
        assert [e.event["message"]["parts"][0]["text"] for e in history.events] == ["B's own note"]
        assert (await b.list_sessions("bob")).sessions[0].session == "s1"
    async with await app_client(secured, A) as a:  # and A does not see it
        assert (await a.list_sessions("bob")).sessions == []


async def test_unknown_or_wrong_credentials_are_refused(secured):
    for options in (
        {},
        {"user": "workers", "password": "wrong"},
        {"user": security.app_user_name(A), "password": secured.passwords["workers"]},
    ):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(secured.server.url, allow_reconnect=False, error_cb=Errors().record, **options)


async def test_large_artifacts_go_through_trusted_connections_and_die_with_their_session(secured):
    admin = await connect_as(secured, "admin")
    try:
        big = bytes(range(256)) * 2048  # 512 KiB: over the inline limit, into the object store
        operator = MemoryClient(admin, A)
        await operator.save_artifact("carol", "big", "scan.bin", big)
        async with await app_client(secured, A) as a:
            assert (await a.list_artifacts("carol", "big", min_seq=operator.last_seq)).artifacts
            a.timeout = 1.0
            with pytest.raises(Forbidden, match="object store"):  # A's user may not read the object store
                await a.get_artifact("carol", "big", "scan.bin", min_seq=operator.last_seq)
            await a.delete_session("carol", "big")  # the persistence worker deletes the object
        store = await admin.jetstream().object_store("MEMQ_ARTIFACTS")

        assert len(await store.list(ignore_deletes=True)) == 1

        async def gone() -> bool:  # list() raises NotFoundError when the store is empty
            try:
                return not await store.list(ignore_deletes=True)
            except NotFoundError:
                return True

        await wait_for(gone, 30, "the artifact's object deleted by the persistence worker")
    finally:
        await admin.close()


async def test_operators_see_status_and_workers_never_hit_a_wall(secured):
    b_nc = await connect_as(secured, security.app_user_name(B), inbox_prefix=app_inbox_prefix(B))
    await b_nc.publish(events_subject(A, "x", "y"), b"{}")  # one violation the log must show
    await bus.settle(b_nc)  # the server has read the publish (a flush's PING may pass it)
    await b_nc.close()
    admin = await connect_as(secured, "admin")
    try:
        report = await collect_status(admin, secured.settings.streams)
        assert {c.name for c in report.consumers} >= {"memq-persistence", "memq-indexing"}
        assert report.instances, "no worker answered $SRV.INFO through its permissions"
        print(sorted(i.name for i in report.instances))
    finally:
        await admin.close()
    # Every worker kind has run against these permissions during this module:
    # the server logged no violation for the workers user.
    log = secured.server.log_path.read_text()
    worker_lines = [line for line in log.splitlines() if "Violation" in line and '/user:workers"' in line]
    assert worker_lines == [], "\n".join(worker_lines)
    assert f'/user:{security.app_user_name(B)}" - Publish Violation' in log  # B's were: the check above can fail


async def test_b_cannot_read_a_s_facts_by_any_door(secured):
    # A's facts, as the fact worker writes them (no LLM needed for the fence).
    said = Source(1, "s1", "e1", 1000.0)
    fact = Fact(
        fact_id(A, "alice", "Alice lives in Porto.", said),
        A,
        "alice",
        "Alice lives in Porto.",
        ("Porto",),
        (said,),
        1000.0,
    )
    engine = create_engine(secured.settings.database_url())
    try:
        async with engine.begin() as conn:
            gen = await facts_store.ensure_generation(conn, "facts-security", "test")
            await facts_store.commit_batch(conn, gen.name, [Change("added", fact)])
    finally:
        await engine.dispose()
    a = await app_client(secured, A)
    try:
        assert [f.id for f in (await a.facts("alice")).facts] == [fact.id]  # A reads its own
    finally:
        await a.close()
    errors = Errors()
    b_nc = await connect_as(secured, security.app_user_name(B), errors, inbox_prefix=app_inbox_prefix(B))
    try:
        as_a = MemoryClient(b_nc, A, timeout=1.0, consistent=False, wait_ms=0)
        for read in (as_a.facts("alice"), as_a.profile("alice"), as_a.fact_history("alice", fact.id)):
            with pytest.raises(Forbidden, match=VIOLATION):
                await read
        for op, extra in (("facts", {}), ("facts.profile", {}), ("facts.history", {"fact_id": fact.id})):
            request = build_request(A, op, user="alice", **extra)  # B's own subject, a body naming A
            reply = await b_nc.request(request_subject(B, op), encode_request(request), timeout=5)
            with pytest.raises(Forbidden, match="sent on a subject of app"):
                parse_reply(op, reply.data)
        own = MemoryClient(b_nc, B, timeout=5.0, consistent=False, wait_ms=0)
        assert (await own.facts("alice")).facts == [] and (await own.profile("alice")).entities == []
        with pytest.raises(NotFound):  # A's fact id, asked in B's own app: not found, as one that never was
            await own.fact_history("alice", fact.id)
    finally:
        await b_nc.close()
