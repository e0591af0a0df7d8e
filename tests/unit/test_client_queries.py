"""MemoryClient's reads: request building, reply parsing and error mapping (pure),
then the wire protocol against a stand-in responder on a real nats-server.

The stand-in only checks what the client sends and how it reads answers; the
query service has its own tests, and tests/integration/test_cli_queries.py
runs the client against the real one.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Callable
from typing import Any

import nats
import orjson
import pytest

from memq.contracts.client import MemoryClient, build_request, encode_request, parse_reply
from memq.contracts.errors import (
    Busy,
    Forbidden,
    InvalidId,
    InvalidRequest,
    MemqError,
    NotCommitted,
    NotFound,
    TemplateKeyMissing,
    Unavailable,
)
from memq.contracts.queries import ContextView, HistoryView, SessionsPage, SessionView, StrategySpec
from memq.contracts.subjects import ARTIFACT_BUCKET, EVENTS_STREAM, request_subject
from memq.workers.runtime.bus import ensure_streams, settle
from memq.workers.settings import StreamSettings

APP = "agent.one"  # a dot: the subject must carry the encoded token
USER = "ada@example.com"
SESSION = "session 1"

SESSION_INFO = {"app": APP, "user": USER, "session": SESSION, "created_at": 1.0, "updated_at": 2.0, "last_seq": 7}


def ok(result: dict) -> bytes:
    return orjson.dumps({"ok": True, "result": result})


def failed(code: str, message: str = "why") -> bytes:
    return orjson.dumps({"ok": False, "error": {"code": code, "message": message}})


# --- pure: building requests ----------------------------------------------------


def test_request_body_has_version_app_and_no_unset_fields():
    request = build_request(APP, "session.get", user=USER, session=SESSION, events=True, num_recent_events=None)
    assert orjson.loads(encode_request(request)) == {
        "v": 1,
        "app": APP,
        "user": USER,
        "session": SESSION,
        "events": True,
        "wait_ms": 2000,
    }


def test_strategy_may_be_a_dict():
    request = build_request(APP, "history", user=USER, session=SESSION, strategy={"kind": "token_window", "budget": 9})
    assert request.strategy == StrategySpec(kind="token_window", budget=9)
    assert orjson.loads(encode_request(request))["strategy"] == {"kind": "token_window", "budget": 9}


def test_sessions_list_needs_no_user():
    body = orjson.loads(encode_request(build_request(APP, "sessions.list", user=None, limit=10)))
    assert "user" not in body and body["limit"] == 10


@pytest.mark.parametrize(
    ("op", "fields", "error"),
    [
        ("session.get", {"user": "", "session": SESSION}, InvalidId),
        ("session.get", {"user": USER, "session": "x" * 300}, InvalidId),
        ("sessions.list", {"limit": 501}, InvalidRequest),
        ("history", {"user": USER, "session": SESSION, "strategy": {"kind": "everything"}}, InvalidRequest),
        ("context", {"user": USER, "session": SESSION, "format": "xml"}, InvalidRequest),
        ("session.get", {"user": USER, "session": SESSION, "min_seq": -1}, InvalidRequest),
        ("session.drop", {"user": USER}, InvalidRequest),
    ],
)
def test_bad_requests_fail_before_any_io(op, fields, error):
    with pytest.raises(error):
        build_request(APP, op, **fields)


# --- pure: parsing replies ------------------------------------------------------


def test_reply_is_typed():
    view = parse_reply("session.get", ok({**SESSION_INFO, "state": {"app:x": 1}, "events": None}))
    assert isinstance(view, SessionView) and view.state == {"app:x": 1} and view.events is None


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("not_found", NotFound),
        ("forbidden", Forbidden),
        ("not_committed", NotCommitted),
        ("invalid_request", InvalidRequest),
        ("unavailable", Unavailable),
        ("busy", Busy),
        ("template_key_missing", TemplateKeyMissing),
        ("from_the_future", MemqError),
    ],
)
def test_error_replies_become_typed_errors(code, error):
    with pytest.raises(error, match="the reason") as info:
        parse_reply("history", failed(code, "the reason"))
    assert type(info.value) is error


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"ok": true}', b'{"ok": true, "result": {"tokens": "x"}}'])
def test_malformed_replies_raise_memq_error(data):
    with pytest.raises(MemqError, match="malformed history reply"):
        parse_reply("history", data)


def test_inline_artifact_bytes_come_as_base64():
    payload = bytes(range(256))
    view = parse_reply(
        "artifacts.get",
        ok(
            {
                "filename": "f",
                "version": 0,
                "seq": 3,
                "mime_type": "x",
                "size": 256,
                "sha256": "0" * 64,
                "inline": base64.b64encode(payload).decode(),
            }
        ),
    )
    assert view.inline == payload


# --- the wire, against a stand-in responder --------------------------------------

Answer = Callable[[dict[str, Any]], bytes]


class StandIn:
    """Answers every ``memq.v1.q.<app>.>`` request with ``answers[op](body)``
    and records ``(op, body)``; an op without an answer gets no reply."""

    def __init__(self, nc, answers: dict[str, Answer], delay: float = 0.0):
        self.nc = nc
        self.answers = answers
        self.delay = delay
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.prefix = request_subject(APP, "")

    async def start(self) -> StandIn:
        self.sub = await self.nc.subscribe(request_subject(APP, ">"), cb=self._answer)
        await settle(self.nc)
        return self

    async def _answer(self, msg) -> None:
        op, body = msg.subject.removeprefix(self.prefix), orjson.loads(msg.data)
        self.requests.append((op, body))
        await asyncio.sleep(self.delay)
        if op in self.answers:
            await msg.respond(self.answers[op](body))


@pytest.fixture
async def nc(nats_url: str):
    conn = await nats.connect(nats_url)
    await ensure_streams(conn.jetstream(), StreamSettings())
    yield conn
    await conn.close()


@pytest.fixture
def client(nc) -> MemoryClient:
    return MemoryClient(nc, APP, timeout=2)


async def test_get_session_goes_to_the_app_subject(client, nc):
    stand_in = await StandIn(nc, {"session.get": lambda b: ok({**SESSION_INFO, "state": {"k": b["user"]}})}).start()
    view = await client.get_session(USER, SESSION, num_recent_events=3)
    assert view.state == {"k": USER} and view.last_seq == 7
    op, body = stand_in.requests[0]
    assert op == "session.get"  # on memq.v1.q.<encoded app>.session.get, where the stand-in listens
    assert body == {
        "v": 1,
        "app": APP,
        "user": USER,
        "session": SESSION,
        "events": True,
        "num_recent_events": 3,
        "wait_ms": 2000,
    }


async def test_reads_wait_for_the_clients_own_last_write(client, nc):
    stand_in = await StandIn(nc, {"state.get": lambda b: ok({"state": {}})}).start()
    await client.get_state(USER)
    assert "min_seq" not in stand_in.requests[-1][1]  # nothing published yet
    await client.create_session(USER, SESSION)
    seq = await client.append_text(USER, SESSION, "user", "hi")
    many = await client.append_many(USER, SESSION, [])  # publishes nothing: last_seq unchanged
    assert many == [] and client.last_seq == seq
    await client.get_state(USER, SESSION)
    assert stand_in.requests[-1][1]["min_seq"] == seq
    await client.get_state(USER, SESSION, min_seq=2)
    assert stand_in.requests[-1][1]["min_seq"] == 2
    await client.get_state(USER, SESSION, min_seq=0)  # explicit: do not wait
    assert "min_seq" not in stand_in.requests[-1][1]
    relaxed = MemoryClient(nc, APP, consistent=False)
    await relaxed.append_text(USER, SESSION, "user", "hi")
    await relaxed.get_state(USER, SESSION)
    assert "min_seq" not in stand_in.requests[-1][1]


async def test_request_timeout_includes_the_wait_for_min_seq(nc):
    await StandIn(nc, {"state.get": lambda b: ok({"state": {"slow": True}})}, delay=0.5).start()
    patient = MemoryClient(nc, APP, timeout=0.2, wait_ms=1000)
    assert await patient.get_state(USER) == {"slow": True}
    hasty = MemoryClient(nc, APP, timeout=0.2, wait_ms=0)
    with pytest.raises(Unavailable, match=r"within 0.2s on memq\.v1\.q\."):
        await hasty.get_state(USER)


async def test_no_service_says_what_to_run(client):
    with pytest.raises(Unavailable, match=r"no query service is answering on memq\.v1\.q\.[^ ]+\.history: .*memq up"):
        await client.history(USER, SESSION)


async def test_error_reply_raises_typed_error(client, nc):
    await StandIn(nc, {"history": lambda b: failed("not_found", f"no session {b['session']!r}")}).start()
    with pytest.raises(NotFound, match="no session 'session 1'"):
        await client.history(USER, SESSION, strategy={"kind": "all"})


async def test_iter_sessions_follows_cursors(client, nc):
    sessions = [{**SESSION_INFO, "session": f"s{i}"} for i in range(7)]

    def page(body: dict) -> bytes:
        start = int(body.get("cursor", 0))
        end = start + body["limit"]
        return ok({"sessions": sessions[start:end], "next_cursor": str(end) if end < len(sessions) else None})

    stand_in = await StandIn(nc, {"sessions.list": page}).start()
    seen = [info.session async for info in client.iter_sessions(page_size=3)]
    assert seen == [s["session"] for s in sessions]
    assert [body.get("cursor") for _, body in stand_in.requests] == [None, "3", "6"]
    first = await client.list_sessions(USER, limit=2)
    assert isinstance(first, SessionsPage) and first.next_cursor == "2"


def artifact_answer(data: bytes, **extra) -> Answer:
    meta = {
        "filename": "f.bin",
        "version": 1,
        "seq": 9,
        "mime_type": "application/octet-stream",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return lambda body: ok({**meta, **extra})


async def test_get_artifact_inline_and_from_the_object_store(client, nc):
    small, large = b"tiny", bytes(range(256)) * 20_000  # 5 MB: many object-store chunks
    answers = {"artifacts.get": artifact_answer(small, inline=base64.b64encode(small).decode())}
    stand_in = await StandIn(nc, answers).start()
    assert await client.get_artifact(USER, SESSION, "f.bin") == small
    assert "version" not in stand_in.requests[-1][1]

    store = await nc.jetstream().object_store(ARTIFACT_BUCKET)
    await store.put("big/object", large)
    answers["artifacts.get"] = artifact_answer(large, object={"bucket": ARTIFACT_BUCKET, "name": "big/object"})
    assert await client.get_artifact(USER, SESSION, "f.bin", version=1) == large
    assert stand_in.requests[-1][1]["version"] == 1

    answers["artifacts.get"] = artifact_answer(b"other", inline=base64.b64encode(small).decode())
    with pytest.raises(MemqError, match="corrupt"):
        await client.get_artifact(USER, SESSION, "f.bin")
    answers["artifacts.get"] = artifact_answer(large, object={"bucket": ARTIFACT_BUCKET, "name": "gone"})
    with pytest.raises(NotFound, match="gone"):
        await client.get_artifact(USER, SESSION, "f.bin")


class Completion:
    """Like an OpenAI chat completion message: the text is in ``.content``."""

    def __init__(self, content: str):
        self.content = content


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_with_history_appends_both_turns_around_the_model_call(client, nc, asynchronous):
    def context(body: dict) -> bytes:
        messages = [{"role": "user", "content": f"up to seq {body['min_seq']}"}]
        return ok({"format": body["format"], "tokens": {"total": 5}, "messages": messages})

    stand_in = await StandIn(nc, {"context": context}).start()
    seen: list[list[dict]] = []

    def sync_model(messages):
        seen.append(messages)
        return Completion("an answer")

    async def async_model(messages):
        seen.append(messages)
        return "an answer"

    chat = client.with_history(
        async_model if asynchronous else sync_model, user=USER, session=SESSION, instruction="Be {tone?}."
    )
    assert await chat("a question") == "an answer"

    js = nc.jetstream()
    last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
    asked, answered = [orjson.loads((await js.get_msg(EVENTS_STREAM, s)).data) for s in (last - 1, last)]
    assert asked["event"]["message"] == {"role": "user", "parts": [{"type": "text", "text": "a question"}]}
    assert answered["event"]["message"]["role"] == "assistant"
    assert answered["event"]["message"]["parts"][0]["text"] == "an answer"
    op, body = stand_in.requests[-1]
    assert (op, body["min_seq"], body["format"], body["instruction"]) == ("context", last - 1, "openai", "Be {tone?}.")
    assert seen == [[{"role": "user", "content": f"up to seq {last - 1}"}]]


async def test_typed_history_and_context(client, nc):
    event = {"seq": 3, "tokens": 4, "event": {"id": "e", "message": {"role": "user", "parts": []}}}
    await StandIn(
        nc,
        {
            "history": lambda b: ok({"strategy": {"kind": "all"}, "events": [event], "tokens": 4}),
            "context": lambda b: ok(
                {"format": "memq", "tokens": {"window": 4, "total": 4}, "messages": [], "context": {"summary": None}}
            ),
        },
    ).start()
    history = await client.history(USER, SESSION)
    assert isinstance(history, HistoryView) and history.events[0].tokens == 4 and not history.needs_summary
    context = await client.context(USER, SESSION)
    assert isinstance(context, ContextView) and context.tokens["total"] == 4
