"""Bad input never crashes memq and never disappears (issue 6).

A hypothesis fuzzer publishes hostile stream messages of every kind (random
bytes, invalid UTF-8, wrong shapes and types, missing, extra, null and huge
fields, ids over 256 bytes, unicode edge cases, injection strings), mixed
with valid ones, raw onto ``MEMQ_EVENTS`` against real NATS, SQL (PostgreSQL
and SQLite) and real persistence and indexing workers. Every message
published must end as exactly one of: its rows committed (valid), or one
dead letter with a typed code and a one-line reason (broken); the contract's
decoder says which, and the suite checks the running system agrees. Both
workers must drain every batch, and log no error and no line forged by input.
Raw requests of every op get the same treatment against a real query worker
(with a real index behind ``search``): each gets a typed reply, never silence
or an untyped crash. The client refuses bad ids and values with typed errors
before sending anything. After each batch a fresh valid write or read still
works: the system keeps serving.

Examples are batches (publish all, wait once, check all), which keeps the
file near a minute on 2 cores. Every bug this fuzzer found is replayed first
as an explicit example (``*_regressions`` in fuzz_strategies.py). Shrinking
is off: the workers, streams and databases outlive an example, so a replay
is not the same experiment; a failure reports the batch and the case's label.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from helpers import SharedEmbedder, make_settings, running, running_query, running_worker, wait_for
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from faults.fuzz_strategies import (
    HOSTILE,
    LIMIT_IDS,
    RequestCase,
    StreamCase,
    bad_ids,
    request_cases,
    request_regressions,
    request_verdict,
    stream_cases,
    stream_regressions,
    valid_ids,
)
from memq.contracts.client import MemoryClient, parse_reply
from memq.contracts.codec import decode_from_subject
from memq.contracts.dlq import DUPLICATE_ID
from memq.contracts.errors import (
    ERRORS_BY_CODE,
    InvalidId,
    InvalidMessage,
    InvalidRequest,
    MemqError,
    Oversize,
)
from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.runtime import bus
from memq.workers.settings import LocalEmbedderSettings
from memq.workers.sql import models, reads

MAX_BYTES = 16 * 1024  # the worker's limit here
STREAM_MAX_BYTES = 2 * MAX_BYTES  # what the stream takes (memq.workers.runtime.bus): oversize ones still reach the DLQ
NATS_MAX_PAYLOAD = 1024 * 1024  # nats-server's default
TYPED_CODES = set(ERRORS_BY_CODE) - {MemqError.code}
FUZZ = dict(
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: see the module doc
    # The stack (servers, workers) is built once per test and shared by its
    # examples on purpose: the system must keep serving across all of them.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


class WorkerLog(logging.Handler):
    """Watches memq's loggers: an ERROR means a worker met a bug (an exception
    in a handler), not bad input; a CR or LF in a message means the input
    forged log lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> WorkerLog:
        logging.getLogger("memq").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("memq").removeHandler(self)

    def assert_clean(self) -> None:
        errors = [r for r in self.records if r.levelno >= logging.ERROR]
        assert not errors, "worker errors:\n" + "\n".join(self.format(r) for r in errors[:5])
        forged = [r.getMessage() for r in self.records if "\r" in r.getMessage() or "\n" in r.getMessage()]
        assert not forged, f"log lines forged by input: {forged[:3]!r}"
        self.records.clear()


@pytest.fixture(scope="module")
def embedder():
    return LocalEmbedder(LocalEmbedderSettings())


async def start_indexing(exits, settings, embedder) -> IndexingWorker:
    worker = await exits.enter_async_context(running(IndexingWorker(settings), embedder=SharedEmbedder(embedder)))
    await asyncio.wait_for(worker.ready.wait(), 60)
    return worker


# --- stream messages --------------------------------------------------------------


@dataclass
class StreamStack:
    settings: Any
    worker: Any
    nc: Any
    js: Any
    errors: WorkerLog
    published_ids: set[str] = field(default_factory=set)  # Nats-Msg-Ids sent so far
    dlq_seen: int = 0  # last DLQ sequence already checked
    totals: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints fixtures of a failing example
        p.text(f"<{type(self).__name__}>")


@pytest.fixture
async def stream_stack(request, db, nats_url, tmp_path, embedder):
    settings = make_settings(nats_url, request.getfixturevalue(db), tmp_path)
    settings.streams.max_message_bytes = MAX_BYTES
    with WorkerLog() as errors:
        async with running_worker(settings) as worker, AsyncExitStack() as exits:
            # It decodes with the same codec and must skip what persistence dead-letters.
            await start_indexing(exits, settings, embedder)
            nc = await nats.connect(nats_url)
            assert nc.max_payload == NATS_MAX_PAYLOAD
            stack = StreamStack(settings, worker, nc, nc.jetstream(timeout=5), errors)
            try:
                yield stack
            finally:
                await nc.close()
    # Proof the fuzzer is not vacuous: it committed and dead-lettered plenty.
    print(f"\n{db}: {dict(stack.totals)}")
    assert stack.totals["committed"] >= 20 and stack.totals["dead-lettered"] >= 20, dict(stack.totals)


async def publish(js, case: StreamCase):
    try:
        return await js.publish(case.subject, case.payload, headers=case.headers)
    except (nats.errors.Error, TimeoutError) as exc:
        return exc


async def drained(stack: StreamStack, last_seq: int) -> None:
    """Until the persistence and indexing workers have acked everything up to ``last_seq``."""

    async def done(durable: str) -> bool:
        info = await stack.js.consumer_info(stack.settings.streams.events, durable)
        return info.delivered.stream_seq >= last_seq and info.num_pending == 0 and info.num_ack_pending == 0

    for durable in (stack.settings.persistence.durable, stack.settings.indexing.durable):
        await wait_for(
            lambda d=durable: done(d), timeout=60, what=f"{durable} to handle every message up to seq {last_seq}"
        )


async def new_dead_letters(stack: StreamStack) -> dict[int, list[Any]]:
    """DLQ entries since the last call, by the stream sequence they came from."""
    info = await stack.js.stream_info(stack.settings.streams.dlq)
    letters: dict[int, list[Any]] = defaultdict(list)
    for seq in range(stack.dlq_seen + 1, info.state.last_seq + 1):
        msg = await stack.js.get_msg(stack.settings.streams.dlq, seq)
        letters[int(msg.headers["Memq-Original-Seq"])].append(msg)
    stack.dlq_seen = info.state.last_seq
    return letters


def verdict(case: StreamCase) -> str | None:
    """The contract's word on a message: None (valid) or the error code."""
    try:
        decode_from_subject(case.subject, case.payload, max_bytes=MAX_BYTES)
    except MemqError as exc:
        return exc.code
    return None


async def committed(engine, message, *, state: bool = True) -> str | None:
    """None if the message's effect is in SQL, else what is missing
    (``state=False``: its row only, not its state delta)."""
    kind = message.kind
    app, user, session = message.app, message.user, getattr(message, "session", None)
    m = models
    if kind == "event":
        query = select(m.Event.seq).where(
            m.Event.session_key == scope_key(app, user, session), m.Event.event_id == message.event.id
        )
        delta = message.event.actions.state_delta
    elif kind == "session.create":
        s = m.Session.__table__.c
        query = select(s.key).where(s.key == scope_key(app, user, session), s.last_seq > s.deleted_seq)
        delta = message.state
    elif kind == "session.delete":
        s = m.Session.__table__.c
        query = select(s.key).where(s.key == scope_key(app, user, session), s.deleted_seq > 0)
        delta = {}
    elif kind == "user.delete":
        u = m.User.__table__.c
        query = select(u.key).where(u.key == scope_key(app, user), u.deleted_seq > 0)
        delta = {}
    elif kind == "artifact.save":
        a = m.Artifact.__table__.c
        query = select(a.seq).where(a.session_key == scope_key(app, user, session), a.artifact_id == message.id)
        delta = {}
    elif kind == "checkpoint":
        c = m.Checkpoint.__table__.c
        query = select(c.seq).where(c.session_key == scope_key(app, user, session), c.checkpoint_id == message.id)
        delta = {}
    elif kind == "event.forget":  # forgets an event in the deletes' namespace, if any: nothing to show
        query, delta = None, {}
    else:  # state.set: only its keys show
        query, delta = None, message.delta
    if query is not None:
        async with engine.connect() as conn:
            if (await conn.execute(query)).first() is None:
                return f"no {kind} row"
    keys = [k for k in delta if not k.startswith("temp:")]
    if keys and state:
        stored = await reads.state(engine, app, user, session)
        missing = [k for k in keys if k not in stored]
        if missing:
            return f"state keys {missing[:3]!r} missing"
    return None


async def still_serving(stack: StreamStack) -> None:
    """A fresh event through the client commits after the batch."""
    client = MemoryClient(stack.nc, "fuzz-sentinel", max_message_bytes=MAX_BYTES)
    event = Event(message=Message(role="user", parts=[TextPart(text="still there?")]))
    await client.append("u", "sentinel", event)

    async def stored() -> bool:
        return event.id in [
            e.event_id for e in await reads.events(stack.worker.live.engine, "fuzz-sentinel", "u", "sentinel")
        ]

    await wait_for(stored, timeout=30, what="a fresh valid event after the fuzz batch")


@pytest.mark.parametrize("db", ["pg_url", "sqlite_url"])
@settings(max_examples=30, **FUZZ)
@given(batch=st.lists(stream_cases(MAX_BYTES, NATS_MAX_PAYLOAD), min_size=15, max_size=30))
@example(batch=stream_regressions())
async def test_every_message_is_committed_or_dead_lettered_with_a_typed_reason(stream_stack, db, batch):
    stack = stream_stack
    acks = [await publish(stack.js, case) for case in batch]
    seqs = [a.seq for a in acks if not isinstance(a, Exception)]
    if seqs:
        await drained(stack, max(seqs))
    # Duplicates first, in publish order, before any check can stop the loop:
    # the ids must be on record if hypothesis replays the batch.
    dropped = set()
    for i, (case, ack) in enumerate(zip(batch, acks)):
        if isinstance(ack, Exception):
            continue
        if ack.duplicate:
            dropped.add(i)
            # JetStream kept an earlier message with this Nats-Msg-Id: fine if
            # the producer reused the id, a silent loss if the ids differ.
            assert case.msg_id in stack.published_ids, f"{case!r}: dropped as a duplicate of another id"
        elif case.msg_id is not None:
            stack.published_ids.add(case.msg_id)
    letters = await new_dead_letters(stack)
    outcomes = defaultdict(int)
    for i, (case, ack) in enumerate(zip(batch, acks)):
        where = f"{case.label} (subject {case.subject[:80]!r}, payload {case.payload[:120]!r})"
        if case.expect == "refuse" or isinstance(ack, Exception):  # larger than the stream or NATS takes
            assert isinstance(ack, (nats.errors.MaxPayloadError, nats.js.errors.APIError)), f"{where}: {ack!r}"
            # The stream's limit is twice the worker's and counts headers too.
            assert len(case.payload) > STREAM_MAX_BYTES - 1024, f"{where}: refused at {len(case.payload)} bytes"
            continue
        assert len(case.payload) <= STREAM_MAX_BYTES, f"{where}: the stream took {len(case.payload)} bytes"
        code = verdict(case)
        if case.expect == "commit":
            assert code is None, f"{where}: built valid, but the decoder says {code}"
        elif case.expect == "reject":
            assert code is not None and case.code in (None, code), f"{where}: expected {case.code}, decoder says {code}"
        if i in dropped:
            continue
        mine = letters.pop(ack.seq, [])
        if code is None and [m.headers["Memq-Error-Code"] for m in mine] == [DUPLICATE_ID]:
            # A valid event whose session holds its id with other content (the
            # fuzzer reuses ids): the first one stays, this one is dead-lettered.
            message = case.message or decode_from_subject(case.subject, case.payload, max_bytes=MAX_BYTES)
            assert message.kind == "event", f"{where}: {mine[0].headers}"
            # Its own state delta was never applied: the kept event's row is what must be there.
            missing = await committed(stack.worker.live.engine, message, state=False)
            assert missing is None, f"{where}: no event holds its id ({missing})"
            outcomes["dead-lettered"] += 1
            stack.totals[case.expect] += 1
            continue
        if code is None:
            assert not mine, f"{where}: valid but dead-lettered: {[dict(m.headers) for m in mine]}"
            missing = await committed(
                stack.worker.live.engine,
                case.message or decode_from_subject(case.subject, case.payload, max_bytes=MAX_BYTES),
            )
            assert missing is None, f"{where}: acked but not committed: {missing}"
            outcomes["committed"] += 1
        else:
            assert len(mine) == 1, f"{where}: {len(mine)} dead letters, expected one ({code})"
            headers = mine[0].headers
            assert headers["Memq-Error-Code"] == code, (
                f"{where}: dead-lettered as {headers['Memq-Error-Code']}: {headers['Memq-Error']}"
            )
            assert headers["Memq-Error-Code"] in TYPED_CODES
            reason = headers["Memq-Error"]
            assert isinstance(reason, str) and reason.strip(), f"{where}: no readable reason: {reason!r}"
            assert headers["Memq-Original-Subject"] == case.subject
            assert (mine[0].data or b"") == case.payload, f"{where}: the dead letter is not the message"
            outcomes["dead-lettered"] += 1
        stack.totals[case.expect] += 1
    assert not letters, f"dead letters for messages not published or not broken: {dict(letters)}"
    # Nothing silently dropped: every sequence the stream handed out is one outcome.
    stored = {a.seq for a in acks if not isinstance(a, Exception) and not a.duplicate}
    assert outcomes["committed"] + outcomes["dead-lettered"] == len(stored), (dict(outcomes), len(stored))
    for outcome, n in outcomes.items():
        stack.totals[outcome] += n
    stack.errors.assert_clean()
    await still_serving(stack)


# --- requests ---------------------------------------------------------------------

QAPP = "fuzz-q"
USERS = ["alice", "'; DROP TABLE events; --", "a.b*>", "\u202eevil\u200f", "\U0001f642" * 64]
SESSIONS = ["s1", "../../etc/passwd", "{{template}}", "a\r\nb", "x" * 256]
# What a valid request may still be answered with: typed, and for a reason
# the request cannot know in advance.
ANSWER_ERRORS = {"not_found", "not_committed", "template_key_missing"}
ANSWER_ERRORS_BY_OP = {
    "history": {"invalid_request"},  # a strategy override the app's settings make inconsistent
    "context": {"invalid_request"},
    "sessions.list": {"invalid_request"},  # a cursor this service did not make
}
REFUSALS = {"invalid_request", "invalid_id", "forbidden"}


@dataclass
class QueryStack:
    nc: Any
    client: MemoryClient
    errors: WorkerLog
    totals: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    _repr_pretty_ = StreamStack._repr_pretty_


@pytest.fixture
async def query_stack(nats_url, pg_url, tmp_path, embedder):
    settings = make_settings(nats_url, pg_url, tmp_path)
    with WorkerLog() as errors:
        async with running_worker(settings), AsyncExitStack() as exits:
            await start_indexing(exits, settings, embedder)  # search and recall reach a real index
            query = await exits.enter_async_context(running_query(settings))
            query.searcher.embedder = SharedEmbedder(embedder)
            nc = await nats.connect(nats_url)
            client = MemoryClient(nc, QAPP)
            for i, (user, session) in enumerate(zip(USERS, SESSIONS)):
                await client.create_session(user, session, state={"topic": HOSTILE[i], "user:lang": "fr"})
                for role, text in [("user", "hello " + HOSTILE[-i]), ("assistant", "{{template}} {user:lang}")]:
                    await client.append_text(user, session, role, text)
                await client.save_artifact(user, session, "notes.txt", b"notes", "text/plain")
            seq = await client.set_state(USERS[0], {"app:model": "m"})
            assert (await client.history(USERS[0], SESSIONS[0])).events  # seeded and committed
            assert (await client.search(USERS[0], "hello", min_seq=seq)).results  # and indexed
            stack = QueryStack(nc, client, errors)
            try:
                yield stack
            finally:
                await nc.close()
    print(f"\nrequests: {dict(stack.totals)}")
    assert stack.totals["answered"] >= 20 and stack.totals["refused"] >= 20, dict(stack.totals)


async def ask(nc, case: RequestCase):
    try:
        # A liveness bound, not a latency one: a batch of up to 40 requests
        # (searches embed on the CPU) shares this process's loop with the
        # workers, and on a loaded CI machine one took over 10 s.
        return await nc.request(case.subject, case.body, timeout=60)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError, nats.errors.MaxPayloadError) as exc:
        return exc


@settings(max_examples=30, **FUZZ)
@example(batch=request_regressions(QAPP, USERS[0], SESSIONS[0]))
@given(
    batch=st.lists(
        request_cases(QAPP, st.sampled_from(USERS) | valid_ids, st.sampled_from(SESSIONS) | valid_ids),
        min_size=20,
        max_size=40,
    )
)
async def test_every_request_gets_a_typed_reply(query_stack, batch):
    stack = query_stack
    replies = await asyncio.gather(*(ask(stack.nc, case) for case in batch))
    for case, reply in zip(batch, replies):
        where = f"{case.label} (subject {case.subject[:80]!r}, body {case.body[:200]!r})"
        if case.expect == "no_responder":  # no worker serves an unknown op: the requester hears so at once
            assert isinstance(reply, nats.errors.NoRespondersError), f"{where}: {reply!r}"
            continue
        if isinstance(reply, nats.errors.MaxPayloadError):  # nats-py refused to send it
            assert len(case.body) > NATS_MAX_PAYLOAD - 1024, f"{where}: {reply!r}"
            continue
        assert not isinstance(reply, Exception), f"{where}: no reply: {reply!r}"
        valid, why = request_verdict(case.op, case.app_token, case.body)
        if case.expect == "answer":
            assert valid, f"{where}: built valid, but the contract refuses it: {why}"
        elif case.expect == "refuse":
            assert not valid, f"{where}: built broken, but the contract accepts it"
        try:
            parse_reply(case.op, reply.data)
        except MemqError as exc:
            assert exc.code in TYPED_CODES and type(exc) is not MemqError, (
                f"{where}: untyped reply {reply.data[:300]!r}"
            )
            assert exc.message.strip(), f"{where}: an error without a reason"
            allowed = ANSWER_ERRORS | ANSWER_ERRORS_BY_OP.get(case.op, set()) if valid else REFUSALS
            assert exc.code in allowed, f"{where}: {exc.code}: {exc.message} (valid: {valid} {why})"
            stack.totals["refused" if not valid else "answered"] += 1
        else:
            assert valid, f"{where}: answered a request the contract refuses ({why})"
            stack.totals["answered"] += 1
    stack.errors.assert_clean()
    # Still serving: client reads of seeded data, from SQL and from the index.
    view = await stack.client.history(USERS[1], SESSIONS[1])
    assert [e.event["message"]["role"] for e in view.events] == ["user", "assistant"]
    assert (await stack.client.search(USERS[0], "hello")).results


# --- the client -------------------------------------------------------------------


def _bad_calls() -> st.SearchStrategy[tuple[str, tuple, dict]]:
    """A MemoryClient call with one bad id or value (everything else fine)."""
    bad_id = bad_ids | st.sampled_from(["\ud800", "a\udfffb"])
    unjson = st.sampled_from([object(), b"\xff\xfe", "\ud800", {"k": {"deep": object()}}])
    bad_delta = st.one_of(
        st.sampled_from(["not a dict", 1, ["k", 1], {"": 1}, {"x" * 257: 1}, {1: "v"}]),
        unjson.map(lambda v: {"k": v}),
    )
    big = "x" * (NATS_MAX_PAYLOAD + 1)
    u, s = "u", "s"
    good_event = Event(message=Message(role="user", parts=[TextPart(text="ok")]))
    bad_strategy = st.sampled_from(
        [{"kind": "fifo"}, {"window": 0}, {"budget": -1}, {"threshold": 0}, {"target": 2}, {"bogus": 1}, "window", 3]
    )
    calls = [
        st.tuples(st.just("create_session"), st.tuples(bad_id, st.just(s)), st.just({})),
        st.tuples(
            st.just("create_session"), st.tuples(st.just(u), bad_id.filter(lambda v: v is not None)), st.just({})
        ),
        st.tuples(st.just("create_session"), st.just((u, s)), bad_delta.filter(bool).map(lambda d: {"state": d})),
        st.tuples(st.just("append"), st.tuples(bad_id, st.just(s), st.just(good_event)), st.just({})),
        st.tuples(
            st.just("append"),
            st.tuples(
                st.just(u),
                st.just(s),
                st.sampled_from([1, "event", {"id": ""}, {"id": "x" * 300}, {"message": {"role": "god"}}]),
            ),
            st.just({}),
        ),
        st.tuples(
            st.just("append_text"),
            st.tuples(st.just(u), st.just(s), st.sampled_from(["admin", "", "USER", None, 1]), st.just("hi")),
            st.just({}),
        ),
        st.tuples(
            st.just("append_text"),
            st.tuples(st.just(u), st.just(s), st.just("user"), st.sampled_from([big, "\ud800", 1, None])),
            st.just({}),
        ),
        st.tuples(st.just("append_many"), st.tuples(st.just(u), bad_id, st.just([good_event])), st.just({})),
        st.tuples(
            st.just("append_many"),
            st.just((u, s)),
            st.sampled_from([1, "x", {"id": ""}]).map(lambda bad: {"events": [good_event, bad]}),
        ),
        st.tuples(st.just("set_state"), st.tuples(st.just(u), bad_delta), st.just({})),
        st.tuples(
            st.just("set_state"), st.tuples(st.just(u), st.just({"unscoped": 1})), st.just({})
        ),  # needs a session
        st.tuples(
            st.just("save_artifact"),
            st.tuples(
                st.just(u),
                st.just(s),
                st.sampled_from(["", "x" * 257, "\u00e9" * 129, 1, None, "\ud800"]),
                st.sampled_from([b"small", b"x" * 2048]),
            ),
            st.just({}),
        ),
        st.tuples(
            st.just("save_artifact"), st.tuples(bad_id, st.just(s), st.just("f"), st.just(b"x" * 2048)), st.just({})
        ),
        st.tuples(
            st.just("delete_session"), st.tuples(st.just(u), bad_id.filter(lambda v: v is not None)), st.just({})
        ),
        st.tuples(st.just("delete_user"), st.tuples(bad_id), st.just({})),
        st.tuples(st.just("get_session"), st.tuples(bad_id, st.just(s)), st.just({})),
        st.tuples(
            st.just("get_session"),
            st.just((u, s)),
            st.sampled_from(
                [{"num_recent_events": -1}, {"after_seq": -1}, {"min_seq": -1}, {"num_recent_events": 100_001}]
            ),
        ),
        st.tuples(
            st.just("list_sessions"),
            st.just(()),
            st.sampled_from(
                [
                    {"limit": 0},
                    {"limit": 501},
                    {"cursor": "c" * 513},
                    {"user": ""},
                    {"user": "x" * 257},
                    {"cursor": "\ud800"},
                ]
            ),
        ),
        st.tuples(st.just("get_state"), st.tuples(st.just(u), bad_id.filter(lambda v: v is not None)), st.just({})),
        st.tuples(
            st.just("history"),
            st.just((u, s)),
            st.one_of(bad_strategy.map(lambda b: {"strategy": b}), st.just({"model": "m" * 129})),
        ),
        st.tuples(
            st.just("context"),
            st.just((u, s)),
            st.sampled_from(
                [
                    {"format": "xml"},
                    {"recall_limit": -1},
                    {"recall_limit": 101},
                    {"instruction": "i" * 200_001},
                    {"message": "\ud800"},
                    {"strategy": {"kind": "all", "x": 1}},
                ]
            ),
        ),
        st.tuples(st.just("list_artifacts"), st.tuples(bad_id, st.just(s)), st.just({})),
        st.tuples(
            st.just("get_artifact"), st.tuples(st.just(u), st.just(s), st.sampled_from(["", "f" * 1025])), st.just({})
        ),
        st.tuples(st.just("get_artifact"), st.tuples(st.just(u), st.just(s), st.just("f")), st.just({"version": -1})),
        st.tuples(st.just("search"), st.tuples(st.just(u), st.sampled_from(["", "q" * 8193, "\ud800"])), st.just({})),
        st.tuples(
            st.just("search"),
            st.tuples(st.just(u), st.just("q")),
            st.sampled_from(
                [
                    {"k": 0},
                    {"k": 101},
                    {"mode": "fuzzy"},
                    {"roles": ["god"]},
                    {"authors": ["a"] * 51},
                    {"alpha": 1.5},
                    {"since": "yesterday"},
                    {"session": ""},
                ]
            ),
        ),
    ]
    return st.one_of(*calls)


@pytest.fixture
async def watched_client(nats_url):
    """A client, and a watcher that sees every message it would send."""
    watcher = await nats.connect(nats_url)
    seen: list[str] = []

    async def record(msg) -> None:
        seen.append(msg.subject)

    await watcher.subscribe(">", cb=record)
    await bus.settle(watcher)
    client = await MemoryClient.connect(nats_url, app="fuzz-client", inline_artifact_limit=1024)
    yield client, watcher, seen
    await client.close()
    await watcher.close()


@settings(max_examples=300, **FUZZ)
@given(call=_bad_calls())
async def test_the_client_refuses_bad_ids_and_values_before_sending(watched_client, call):
    client, watcher, seen = watched_client
    method, args, kwargs = call
    with pytest.raises((InvalidId, InvalidMessage, InvalidRequest, Oversize)) as raised:
        await getattr(client, method)(*args, **kwargs)
    assert raised.value.message.strip()
    # settle, not flush: nats-py's flush writes its PING ahead of a publish
    # still queued, so a message sent by mistake could reach the server after
    # the PONG and the watcher after the check
    await bus.settle(client.nc)
    await watcher.flush()
    assert not seen, f"{method}{args!r:.200} sent {seen} before failing"
    assert client.last_seq is None


def test_limit_ids_are_at_the_limit():
    # The strategies' boundary ids are exactly 256 bytes: valid, one more is not.
    assert {len(i.encode()) for i in LIMIT_IDS} == {256}
