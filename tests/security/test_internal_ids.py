"""memq's own publishers against a tenant that takes their ids first
(issue 38, item 5), on the multi-tenant stack (``conftest.py``).

JetStream deduplicates ``Nats-Msg-Id`` across the whole stream, whatever the
subject. App A, with its own credentials, publishes on *its own* subject the
ids the session-expiry sweep and ``memq dlq replay`` will use for B: the old
ids (no content digest) over a range, and, as the worst case, the new ones
with the exact bytes the publisher will send (read here as the operator: an
attacker that predicts everything). B's session must still expire, and the
operator's replay must land on B's subject before its dead letter is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
import pytest
from helpers import wait_for

from memq.contracts import codec
from memq.contracts.dlq import REPLAYED_FROM
from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, EventAppended, Message, SessionDeleted, TextPart
from memq.contracts.subjects import dedupe_id, events_subject
from memq.workers.persistence.expiry import SessionSweeper, expiry_message, idle_sessions
from memq.workers.runtime.dead_letters import DeadLetterFilter, list_dead_letters, replay_dead_letters
from memq.workers.runtime.event_streams import per_app, stream_of
from memq.workers.settings import ExpirySettings
from memq.workers.sql import reads
from memq.workers.sql.engine import create_engine
from memq.workers.sql.models import SESSIONS

from .conftest import A, B, Tenants

pytestmark = pytest.mark.timeout(180)

TTL = 3.0  # seconds: B's sessions' idle TTL for the sweep under test
BOUND = 30.0  # seconds after the TTL by which the session must be gone (sweeps every 0.3 s; a loaded VM)


def said(text: str, id: str | None = None) -> Event:
    event = Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))
    return event if id is None else event.model_copy(update={"id": id})


async def _session_row(engine, app: str, user: str, session: str) -> tuple[int, float] | None:
    """(last_seq, updated_at) of a visible session, as the sweep reads them."""
    s = SESSIONS.c
    q = (
        SESSIONS.select()
        .with_only_columns(s.last_seq, s.updated_at)
        .where(s.key == scope_key(app, user, session), s.last_seq > s.deleted_seq)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(q)).first()
    return None if row is None else (row[0], row[1])


async def _gone(engine, app: str, user: str, session: str) -> bool:
    return not await reads.session_exists(engine, app, user, session)


@pytest.fixture(params=["own streams", "one stream"])
def either(request) -> Tenants:
    """The tenants with a stream each (A's ids land in A's own duplicate
    window: nothing to squat), and on the one shared stream (they land in
    B's window: the squat is seen and gone around)."""
    return request.getfixturevalue("tenants" if request.param == "own streams" else "one_stream_tenants")


async def test_a_squatted_expiry_id_does_not_keep_b_s_session_alive(either):
    """A publishes, every 0.2 s on its own session, the old sweep id of B's
    session and the new one with the very bytes of the sweep's delete. B's
    session is deleted within TTL + BOUND; on a shared stream the sweep
    counts it as squatted (not as a plain success), on B's own stream A
    could not squat at all; a rerun of the same sweep adds no delete."""
    tenants = either
    user, session = "bob", "idle-squatted"
    b_subject = events_subject(B, user, session)
    key = scope_key(B, user, session)
    engine = create_engine(tenants.settings.database_url())
    a = await tenants.app(A)
    workers = await tenants.connect("workers")
    settings = tenants.settings.model_copy(
        update={"expiry": ExpirySettings(apps={B: TTL}, sweep_interval_s=0.3, lease_ttl_s=3.0)}
    )
    sweeper = SessionSweeper(settings, workers, engine)
    squatter: asyncio.Task | None = None
    try:
        async with await tenants.client(B) as b:
            await b.append(user, session, said("B's idle session"))
        await wait_for(lambda: _visible(engine, B, user, session), timeout=30, what="B's session in SQL")
        row = await _session_row(engine, B, user, session)
        assert row is not None
        last_seq, updated_at = row

        a_subject = events_subject(A, "mallory", "asess")
        filler = codec.encode(EventAppended(app=A, user="mallory", session="asess", event=said(".")))
        predicted = SessionDeleted(
            app=B, user=user, session=session, id=f"expired:{key}:{last_seq}", timestamp=updated_at + TTL
        )
        exact = codec.encode(predicted)
        squats = [
            (filler, dedupe_id(b_subject, predicted.id)),  # the id of the sweep before the digest
            (exact, dedupe_id(b_subject, predicted.id, exact)),  # the new one, bytes and all
        ]
        taken: list[int] = []

        async def squat() -> None:
            js = a.jetstream()
            while True:
                for data, msg_id in squats:
                    ack = await js.publish(a_subject, data, headers={"Nats-Msg-Id": msg_id})
                    taken.append(ack.seq)
                await asyncio.sleep(0.2)

        squatter = asyncio.create_task(squat())
        await wait_for(lambda: _true(len(taken) >= 2), timeout=10, what="A's squats stored")
        sweeper.start()
        deadline = BOUND + max(0.0, updated_at + TTL - time.time())
        await wait_for(lambda: _gone(engine, B, user, session), timeout=deadline, what="B's session expired")
        # (expired counts B's other idle sessions too, those of earlier tests on the shared stack)
        own_stream = per_app(tenants.settings.streams)
        assert sweeper.expired >= 1 and (sweeper.squatted == 0 if own_stream else sweeper.squatted >= 1)
        # A rerun as if the delete were not committed yet: the same message, its fresh id remembered.
        assert await sweeper._delete(predicted) is False
    finally:
        if squatter is not None:
            squatter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await squatter
        await sweeper.stop()
        await a.close()
        await workers.close()
        await engine.dispose()


async def test_two_sweeps_of_one_idle_session_delete_it_once(tenants):
    """Exactly once without a squatter: two replicas (or a rerun) finding the
    same idle session publish the same bytes, and JetStream keeps one (the
    old id held this too: a guard for the digest, not a finding). Only this
    session is deleted, not B's others on the shared stack."""
    user, session = "bob", "idle-twice"
    engine = create_engine(tenants.settings.database_url())
    workers = await tenants.connect("workers")
    settings = tenants.settings.model_copy(update={"expiry": ExpirySettings(apps={B: TTL})})
    sweepers = [SessionSweeper(settings, workers, engine) for _ in range(2)]
    try:
        async with await tenants.client(B) as b:
            await b.append(user, session, said("B's other idle session"))
        await wait_for(lambda: _visible(engine, B, user, session), timeout=30, what="B's session in SQL")
        found = await idle_sessions(engine, settings.expiry, time.time() + 2 * TTL, 10_000)
        idle = [x for x in found if (x.app, x.user, x.session) == (B, user, session)]
        assert len(idle) == 1
        landed = await asyncio.gather(*(s._delete(expiry_message(idle[0], TTL)) for s in sweepers))
        assert landed.count(True) == 1 and sum(s.squatted for s in sweepers) == 0
        await wait_for(lambda: _gone(engine, B, user, session), timeout=BOUND, what="B's session expired")
    finally:
        await workers.close()
        await engine.dispose()


async def test_a_squatted_replay_id_does_not_swallow_the_operator_s_replay(either):
    """B's session gets a dead letter (an event id reused with other
    content). A publishes on its own subject the old replay ids of DLQ seqs
    1..60 and the new id of the letter with its very body. The operator's
    replay lands on B's subject (its last message there is the letter's body,
    marked replayed from it; sent again under a fresh id on a shared stream,
    at once on B's own), and only then is the letter deleted."""
    tenants = either
    user, session = "bob", "replayed"
    b_subject = events_subject(B, user, session)
    dlq = tenants.settings.streams.dlq
    js = tenants.admin.jetstream()
    async with await tenants.client(B) as b:
        await b.append(user, session, said("first", id="reused"))
        await b.append(user, session, said("second", id="reused"))

    async def letter():
        letters = await list_dead_letters(js, dlq, DeadLetterFilter(code="duplicate_id"))
        return next((x for x in letters if x.original_subject == b_subject), None)

    await wait_for(lambda: _exists(letter()), timeout=30, what="B's dead letter")
    dead = await letter()
    assert dead is not None

    a = await tenants.app(A)
    try:
        a_js = a.jetstream()
        a_subject = events_subject(A, "mallory", "asess")
        filler = codec.encode(EventAppended(app=A, user="mallory", session="asess", event=said(".")))
        for n in range(1, max(60, dead.seq) + 1):
            await a_js.publish(
                a_subject, filler, headers={"Nats-Msg-Id": dedupe_id(b_subject, f"memq-replay:{dlq}:{n}")}
            )
        exact_id = dedupe_id(b_subject, f"memq-replay:{dlq}:{dead.seq}", dead.data)
        await a_js.publish(a_subject, dead.data, headers={"Nats-Msg-Id": exact_id})
    finally:
        await a.close()

    before = await tenants.stored(b_subject)
    result = await replay_dead_letters(js, dlq, tenants.settings.streams, DeadLetterFilter(seqs=frozenset({dead.seq})))
    assert await tenants.stored(b_subject) == before + 1, "the replay did not land on B's subject"
    squatted = [] if per_app(tenants.settings.streams) else [dead.seq]
    assert result.replayed == [dead.seq] and result.squatted == squatted and not result.skipped
    last = await js.get_last_msg(stream_of(tenants.settings.streams, B), b_subject)
    assert last.data == dead.data and (last.headers or {}).get(REPLAYED_FROM) == str(dead.seq)
    assert orjson.loads(last.data)["event"]["id"] == "reused"
    assert dead.seq not in [x.seq for x in await list_dead_letters(js, dlq)]


async def _visible(engine, app: str, user: str, session: str) -> bool:
    return await reads.session_exists(engine, app, user, session)


async def _exists(awaitable) -> bool:
    return await awaitable is not None


async def _true(value: bool) -> bool:
    return value
