"""The committed JSON Schema files are current, and our own messages, requests
and replies satisfy them."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest
from test_codec import MESSAGES

from memq.contracts import jsonschema as export_schemas
from memq.contracts import queries as q
from memq.contracts.client import build_request, encode_request
from memq.contracts.codec import encode
from memq.contracts.errors import ERRORS_BY_CODE
from memq.contracts.replies import error_body, ok_body
from memq.contracts.schemas import KINDS, Event, EventAppended, Message, TextPart

COMMITTED = export_schemas.DEFAULT_DIR


def _load(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_committed_files_equal_a_fresh_export(tmp_path) -> None:
    fresh = {p.relative_to(tmp_path).as_posix(): _load(p) for p in export_schemas.export(tmp_path)}
    committed = {p.relative_to(COMMITTED).as_posix(): _load(p) for p in COMMITTED.rglob("*.schema.json")}
    assert committed == fresh, "schemas are stale: run `python -m memq.contracts.jsonschema`"
    queries = [name for name in fresh if name.startswith(f"{export_schemas.QUERIES_DIR}/")]
    assert len(fresh) - len(queries) == len(KINDS) + 1
    assert len(queries) == 2 * len(q.OPS) + 1  # a request and a reply per op, and the error reply


def _validator(filename: str) -> jsonschema.Draft202012Validator:
    schema = _load(COMMITTED / filename)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_encoded_messages_validate(message) -> None:
    payload = orjson.loads(encode(message))
    _validator(export_schemas.UNION_FILE).validate(payload)
    _validator(f"{message.kind.replace('.', '-')}.schema.json").validate(payload)


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.pop("v"),
        lambda p: p.update(kind="session.rename"),
        lambda p: p["event"].pop("id"),  # an id the decoder would invent on every decode
        lambda p: p["event"]["message"]["parts"][0].pop("type"),
        lambda p: p.update(surprise=1),
    ],
    ids=["no-version", "unknown-kind", "no-event-id", "part-without-type", "unknown-field"],
)
def test_schema_refuses_what_a_producer_must_not_send(change) -> None:
    event = Event(message=Message(role="user", parts=[TextPart(text="hi")]))
    payload = orjson.loads(encode(EventAppended(app="a", user="u", session="s", event=event)))
    change(payload)
    with pytest.raises(jsonschema.ValidationError):
        _validator(export_schemas.UNION_FILE).validate(payload)


# --- queries ----------------------------------------------------------------------

FACT = q.FactView(
    id="0" * 32,
    statement="Lives in Porto.",
    entities=["Porto"],
    sources=[q.FactSource(seq=3, session="s", event_id="e", at=1.0)],
    valid_from=1.0,
    invalid_from=2.0,
    invalidated_by="1" * 32,
    score=0.5,
)
REQUESTS = {
    "session.get": dict(user="u", session="s", events=True, num_recent_events=5, roles=["user"]),
    "sessions.list": dict(user=None, limit=10, cursor="c"),
    "state.get": dict(user="u"),
    "history": dict(user="u", session="s", strategy={"kind": "none", "budget": 9}, after=1.5),
    "context": dict(user="u", session="s", format="openai", instruction="{x?}", message="hi", min_seq=3),
    "artifacts.list": dict(user="u", session="s"),
    "artifacts.get": dict(user="u", session="s", filename="f.txt", version=0),
    "search": dict(user="u", query="q", mode="keyword", k=3, roles=["summary"], alpha=0.5),
    "facts": dict(user="u", query="where", include_invalid=True, limit=5, min_seq=3),
    "facts.profile": dict(user="u"),
    "facts.history": dict(user="u", fact_id="0" * 32),
}
REPLIES = {
    "session.get": q.SessionView(
        app="a",
        user="u",
        session="s",
        created_at=1.0,
        updated_at=2.0,
        last_seq=3,
        state={"k": 1},
        events=[q.StoredEvent(seq=3, tokens=2, event={"id": "e"})],
        truncated=True,
        events_total=9,
    ),
    "sessions.list": q.SessionsPage(
        sessions=[q.SessionInfo(app="a", user="u", session="s", created_at=1.0, updated_at=2.0, last_seq=3)],
        next_cursor="c",
    ),
    "state.get": q.StateView(state={}),
    "history": q.HistoryView(strategy={"kind": "all"}, events=[], tokens=0, summary="s", checkpoint_seq=2),
    "context": q.ContextView(format="memq", tokens={"total": 1}, messages=[{"role": "user"}], budget=10, note="n"),
    "artifacts.list": q.ArtifactsView(
        artifacts=[q.ArtifactInfo(filename="f", versions=1, latest_seq=2, mime_type="t", size=1)]
    ),
    "artifacts.get": q.ArtifactView(
        filename="f", version=0, seq=2, mime_type="t", size=3, sha256="0" * 64, inline=b"\xff\x00a"
    ),
    "search": q.SearchResults(
        results=[q.SearchResult(session_id="s", event_id="e", content="c", author="a", timestamp=1.0, score=0.5)],
        mode="hybrid",
        model="m",
    ),
    "facts": q.FactsView(facts=[FACT], generation="facts-0", behind=1),
    "facts.profile": q.ProfileView(entities=[q.EntityFacts(entity="Porto", facts=[FACT])], generation="facts-0"),
    "facts.history": q.FactHistoryView(
        revisions=[q.FactRevision(kind="added", fact=FACT, written_at=2.0)], generation="facts-0"
    ),
}


def test_every_op_has_an_example_here() -> None:
    assert set(REQUESTS) == set(REPLIES) == set(q.OPS)


@pytest.mark.parametrize("op", list(q.OPS))
def test_our_requests_and_replies_validate(op) -> None:
    request = orjson.loads(encode_request(build_request("a", op, **REQUESTS[op])))
    _validator(export_schemas.request_file(op)).validate(request)
    replies = _validator(export_schemas.reply_file(op))
    replies.validate(orjson.loads(ok_body(REPLIES[op])))
    for error in ERRORS_BY_CODE.values():
        body = orjson.loads(error_body(error("why")))
        replies.validate(body)
        _validator(export_schemas.ERROR_REPLY_FILE).validate(body)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.pop("v"),  # the service refuses a request without its version
        lambda r: r.update(v=2),
        lambda r: r.pop("session"),
        lambda r: r.update(surprise=1),
        lambda r: r.update(strategy={"kind": "fifo"}),
        lambda r: r.update(format="xml"),
    ],
    ids=["no-version", "other-version", "no-session", "unknown-field", "unknown-strategy", "unknown-format"],
)
def test_request_schema_refuses_what_the_service_refuses(change) -> None:
    request = orjson.loads(encode_request(build_request("a", "context", user="u", session="s")))
    change(request)
    with pytest.raises(jsonschema.ValidationError):
        _validator(export_schemas.request_file("context")).validate(request)


@pytest.mark.parametrize(
    "reply",
    [{"ok": True}, {"ok": True, "result": {"state": "x"}}, {"ok": False}, {"ok": False, "error": {"code": "x"}}],
    ids=["ok-without-result", "wrong-result", "error-without-error", "error-without-message"],
)
def test_reply_schema_refuses_a_malformed_envelope(reply) -> None:
    with pytest.raises(jsonschema.ValidationError):
        _validator(export_schemas.reply_file("state.get")).validate(reply)
