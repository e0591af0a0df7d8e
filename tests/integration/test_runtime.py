"""The worker process as a FastStream app (memq.workers.runtime.app): every kind on
one NATS connection, typed notices on both sides, a bad notice logged and
survived, and a dead NATS failing the start fast."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request

import nats
import pytest
from faststream import FastStream
from helpers import make_settings, wait_for

from memq.contracts.client import MemoryClient
from memq.contracts.notices import CommitNotice, CommittedRanges, StatusEvent
from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import CHANGED_WILDCARD, committed_subject
from memq.workers.runtime import bus
from memq.workers.runtime.app import Process, assemble, build_app
from memq.workers.runtime.kinds import KINDS

APP = "rt"

pytestmark = pytest.mark.timeout(180)


def said(text: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))


def connz(monitor_port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/connz?limit=1000", timeout=5) as r:
        return json.loads(r.read())["connections"] or []


def test_the_app_is_built_without_connecting(tmp_path):
    # No NATS URL and no `memq up`: building must not look for one.
    settings = make_settings("", "sqlite+aiosqlite:///" + str(tmp_path / "x.db"), tmp_path)
    app = build_app(settings)
    assert isinstance(app, FastStream)
    # The summarizer's and the fact worker's triggers (queue groups); no shared cache tier is
    # configured, and the query's commit floor hears its notices with
    # nats-py (test_a_bad_commit_notice_... below goes through it).
    committed = committed_subject(settings.persistence.durable)  # the commit floor's notices
    indexed = committed_subject(settings.indexing.durable)  # the indexing floor's notices
    subscribers = sorted((sub.subject.template, sub.queue) for sub in app.broker.subscribers)
    assert subscribers == sorted(
        [(CHANGED_WILDCARD, settings.facts.queue_group), (CHANGED_WILDCARD, settings.summarizer.queue_group)]
    )
    publishers = sorted(pub.subject.template for pub in app.broker.publishers)
    assert publishers == sorted([CHANGED_WILDCARD, committed, indexed, "memq.v1.status.{app}.{user}.{session}"])
    process = assemble(settings, ["persistence", "query"])
    assert [k.name for k in process.kinds] == ["persistence", "query"]
    assert process.broker._connection is None


async def test_every_kind_runs_on_the_one_connection_of_its_process(fresh_nats, sqlite_url, tmp_path):
    settings = make_settings(fresh_nats.url, sqlite_url, tmp_path)
    settings.indexing.embedder = "none"  # no model to load: this test is about connections
    before = {c["cid"] for c in connz(fresh_nats.monitor_port)}
    process = assemble(settings, list(KINDS))
    await process.start()
    try:
        mine = [c for c in connz(fresh_nats.monitor_port) if c["cid"] not in before]
        assert [c.get("name") for c in mine] == [f"{settings.nats.name}-workers"]
        nc = process.connection
        for component in process.components:
            assert component.nc is nc
        await asyncio.wait_for(process.component("indexing").ready.wait(), 60)
        # The hot paths too: the batch consumers' and the micro services' subscriptions are on it.
        assert all(c.js._nc is nc for c in process.component("persistence").live.consumer.each)
        assert process.component("query").service is not None
        assert len(connz(fresh_nats.monitor_port)) == len(before) + 1
        # ...and they work on it: a write commits, a read answers through the cache path.
        async with await MemoryClient.connect(fresh_nats.url, app=APP) as client:
            seq = await client.append("ada", "s1", said("hello"))
            history = await client.history("ada", "s1", min_seq=seq)
            assert [e.seq for e in history.events] == [seq]
    finally:
        await process.stop()
    assert process.broker._connection is None


async def test_the_query_worker_searches_on_the_processs_one_index_and_embedder(nats_url, sqlite_url, tmp_path):
    """`memq up` loads one embedder, not a second one for search (each kind
    declares what it needs; the process makes one of each)."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    settings.indexing.embedder = "none"  # no model to load: the identity is the point
    process = assemble(settings, ["indexing", "query"])
    await process.start()
    try:
        indexing, query = process.component("indexing"), process.component("query")
        await asyncio.wait_for(indexing.ready.wait(), 60)
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.search("ada", "hello")
        assert query.searcher.backend is indexing.live.backend is process.resources.index
        assert query.searcher.embedder is indexing.live.embedder
    finally:
        await process.stop()
    # Closed once, by the process (the searcher only borrowed them).
    assert process.resources._embedder is None and process.resources._index is None


async def test_notices_are_typed_on_both_sides(nats_url, sqlite_url, tmp_path):
    """What persistence publishes parses as a CommitNotice, with the same
    JSON fields as before the types (nothing on the wire changed)."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    listener = await nats.connect(nats_url)
    seen: list[bytes] = []

    async def heard(msg) -> None:
        seen.append(msg.data)

    await listener.subscribe(CHANGED_WILDCARD, cb=heard)
    await bus.settle(listener)  # the worker publishes on a connection of its own
    process = assemble(settings, ["persistence"])
    await process.start()
    try:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("ada", "s1", said("hi"))
            await wait_for(lambda: _true(bool(seen)), timeout=30, what="a commit notice")
    finally:
        await process.stop()
        await listener.close()
    raw = json.loads(seen[0])
    assert raw == {"app": APP, "user": "ada", "session": "s1", "seq": seq, "app_state": False, "user_state": False}
    notice = CommitNotice.model_validate_json(seen[0])
    assert notice.encode() == seen[0] and not notice.deleted


def test_notice_models_round_trip_and_ignore_unknown_fields():
    deleted = CommitNotice(app="a", user="u", seq=9, deleted=True)
    assert json.loads(deleted.encode()) == {
        "app": "a",
        "user": "u",
        "seq": 9,
        "deleted": True,
        "app_state": False,
        "user_state": False,
    }
    assert CommitNotice.model_validate_json(deleted.encode()) == deleted
    newer = CommitNotice.model_validate_json(b'{"app": "a", "user": "u", "from_the_future": 1}')
    assert newer.session is None and newer.seq is None
    status = StatusEvent(app="a", user="u", session="s", state="summarizing", up_to_seq=4)
    assert json.loads(status.encode()) == {
        "app": "a",
        "user": "u",
        "session": "s",
        "state": "summarizing",
        "up_to_seq": 4,
    }
    assert StatusEvent.model_validate_json(status.encode()) == status


async def test_a_bad_commit_notice_is_logged_and_the_next_one_still_works(nats_url, sqlite_url, tmp_path, caplog):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    process = assemble(settings, ["query"])
    await process.start()
    query = process.component("query")
    dropped: list[dict] = []
    real = query.live.cache.invalidate_local

    async def spy(**scope) -> None:
        dropped.append(scope)
        await real(**scope)

    query.live.cache.invalidate_local = spy
    publisher = await nats.connect(nats_url)
    try:
        with caplog.at_level(logging.WARNING):
            # The query replica hears commits on the persistence replicas'
            # notices of finished sequences, which carry the commit notices.
            subject = committed_subject(settings.persistence.durable)
            for body in (b"not json", b'{"ranges": "none"}', b"[1, 2]"):
                await publisher.publish(subject, body)
            good = CommitNotice(app=APP, user="ada", session="s1", seq=3)
            await publisher.publish(subject, CommittedRanges.of([1, 2, 3], [good]).encode())
            await publisher.flush()
            # It drops the stale answers first, then moves the commit floor.
            await wait_for(lambda: _true(query.live.of(APP).floor.value == 3), timeout=10, what="the good notice")
        assert dropped == [
            {"app": APP, "user": "ada", "session": "s1", "app_state": False, "user_state": False, "listing": True}
        ]
        malformed = [r for r in caplog.records if "malformed notice" in r.getMessage()]
        assert len(malformed) == 3, [r.getMessage() for r in caplog.records]
        assert all(r.levelno == logging.WARNING and r.exc_info is None for r in malformed)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback elsewhere either
        assert process.connection.is_connected
    finally:
        await publisher.close()
        await process.stop()


async def test_a_dead_nats_fails_the_start_fast_and_stop_still_works(tmp_path, sqlite_url):
    from services import free_port

    settings = make_settings(f"nats://127.0.0.1:{free_port()}", sqlite_url, tmp_path)
    process = Process(settings, [KINDS["persistence"].make(settings)])
    started = time.monotonic()
    with pytest.raises(bus.NatsUnreachable, match="cannot reach NATS"):
        await process.start()
    assert time.monotonic() - started < 10
    await process.stop()  # nothing to undo, and no error


async def _true(value: bool) -> bool:
    return value


async def test_settle_sends_its_last_ping_behind_every_subscription(nats_url):
    """The server reads one connection in order, so a PING behind the SUBs
    proves, when its PONG comes back, that the server holds them. nats-py's
    flush writes its PING ahead of SUBs still queued (the CI failure this
    guards against); the wire order is read off the client's transport."""
    nc = await nats.connect(nats_url)
    try:
        wire: list[bytes] = []
        transport = nc._transport  # private: the order bytes go to the socket is the point
        write, writelines = transport.write, transport.writelines
        transport.write = lambda data: (wire.append(bytes(data)), write(data))[1]
        transport.writelines = lambda chunks: (wire.extend(map(bytes, chunks)), writelines(chunks))[1]

        async def ignore(msg) -> None:
            pass

        for k in range(3):
            await nc.subscribe(f"settle.{k}", cb=ignore)
        await bus.settle(nc)

        kinds = [chunk.split(b" ", 1)[0].strip() for chunk in wire]
        assert kinds.count(b"SUB") == 3
        assert kinds[-1] == b"PING", kinds  # after the last SUB
    finally:
        await nc.close()
