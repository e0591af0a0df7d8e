"""The committed AsyncAPI document (contracts/asyncapi.json) is the one the
code generates, and it describes every subject: its references resolve, every
query op has a request and a reply, and its schemas accept what memq sends."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import jsonschema
import orjson
import pytest
from test_codec import MESSAGES
from test_jsonschema import REPLIES, REQUESTS

from memq.contracts import dlq
from memq.contracts import queries as q
from memq.contracts.client import build_request, encode_request
from memq.contracts.codec import encode
from memq.contracts.errors import NotFound
from memq.contracts.notices import CommitNotice, StatusEvent
from memq.contracts.replies import error_body, ok_body
from memq.contracts.schemas import KINDS
from memq.workers.cli import asyncapi_document as asyncapi


@pytest.fixture(scope="module")
def fresh() -> dict[str, Any]:
    return asyncapi.document()


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return json.loads(asyncapi.DEFAULT_PATH.read_text(encoding="utf-8"))


def test_the_committed_document_is_current(fresh) -> None:
    assert asyncapi.DEFAULT_PATH.is_file(), f"no {asyncapi.DEFAULT_PATH}: run `{asyncapi.COMMAND}`"
    stale = asyncapi.DEFAULT_PATH.read_text(encoding="utf-8") != asyncapi.render(fresh)
    assert not stale, f"{asyncapi.DEFAULT_PATH} is stale: run `{asyncapi.COMMAND}` and commit it"


def test_the_document_does_not_depend_on_the_environment(monkeypatch, fresh) -> None:
    monkeypatch.setenv("MEMQ_NATS__URL", "nats://elsewhere:4333")
    monkeypatch.setenv("MEMQ_QUERY__QUEUE_GROUP", "another-group")
    assert asyncapi.document() == fresh


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [ref for v in value.values() for ref in _refs(v)]
    if isinstance(value, list):
        return [ref for v in value for ref in _refs(v)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"{ref}: only references inside the document"
    node: Any = doc
    for token in unquote(ref[2:]).split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and token in node, f"{ref} does not resolve"
        node = node[token]
    return node


def test_every_reference_resolves(committed) -> None:
    refs = _refs(committed)
    assert len(refs) > 100
    for ref in refs:
        _resolve(committed, ref)


def test_every_channel_names_its_address_parameters(committed) -> None:
    for name, channel in committed["channels"].items():
        expressions = set(re.findall(r"{(\w+)}", channel.get("address") or ""))
        assert set(channel.get("parameters", {})) == expressions, name


def test_every_operation_sends_messages_of_its_own_channel(committed) -> None:
    for name, operation in committed["operations"].items():
        channel = operation["channel"]["$ref"]
        assert all(m["$ref"].startswith(f"{channel}/messages/") for m in operation["messages"]), name
        if "reply" in operation:
            reply = operation["reply"]["channel"]["$ref"]
            assert all(m["$ref"].startswith(f"{reply}/messages/") for m in operation["reply"]["messages"]), name


def _payload(doc: dict[str, Any], message_ref: str) -> dict[str, Any]:
    """A schema for the payload of a message, resolved against the whole
    document (its references point into the document's components)."""
    message = _resolve(doc, message_ref)
    if "$ref" in message:
        message = _resolve(doc, message["$ref"])
    return {**doc, **message["payload"]}


def _validate(doc: dict[str, Any], message_ref: str, payload: Any) -> None:
    jsonschema.Draft202012Validator(_payload(doc, message_ref)).validate(payload)


@pytest.mark.parametrize("op", list(q.OPS))
def test_every_query_op_has_its_request_and_reply(committed, op) -> None:
    operation = committed["operations"][f"q.{op}"]
    assert operation["action"] == "receive" and operation["summary"] == q.OPS[op].summary
    channel = _resolve(committed, operation["channel"]["$ref"])
    assert channel["address"] == f"memq.v1.q.{{app}}.{op}"
    assert _resolve(committed, operation["reply"]["channel"]["$ref"])["address"] is None  # the request's inbox

    request = orjson.loads(encode_request(build_request("a", op, **REQUESTS[op])))
    _validate(committed, operation["messages"][0]["$ref"], request)
    with pytest.raises(jsonschema.ValidationError):
        _validate(committed, operation["messages"][0]["$ref"], {**request, "v": 2})

    reply = operation["reply"]["messages"][0]["$ref"]
    _validate(committed, reply, orjson.loads(ok_body(REPLIES[op])))
    _validate(committed, reply, orjson.loads(error_body(NotFound("no such thing"))))
    with pytest.raises(jsonschema.ValidationError):
        _validate(committed, reply, {"ok": True})


def test_no_query_operation_lacks_an_op(committed) -> None:
    ops = {name.removeprefix("q.") for name in committed["operations"] if name.startswith("q.")}
    assert ops == set(q.OPS)


def _messages_on(doc: dict[str, Any], address_start: str) -> dict[str, str]:
    """Message name -> reference, for every channel whose address starts so."""
    found = {}
    for key, channel in doc["channels"].items():
        if (channel.get("address") or "").startswith(address_start):
            found.update({name: f"#/channels/{key}/messages/{name}" for name in channel["messages"]})
    return found


def test_every_stream_message_kind_is_on_the_event_subjects(committed) -> None:
    on_events = _messages_on(committed, "memq.v1.ev.")
    assert set(on_events) == set(KINDS)
    for message in MESSAGES:
        _validate(committed, on_events[message.kind], orjson.loads(encode(message)))
    event = orjson.loads(encode(MESSAGES[0]))
    with pytest.raises(jsonschema.ValidationError):
        _validate(committed, on_events[MESSAGES[0].kind], {**event, "v": 99})
    headers = _resolve(committed, on_events["event"])
    headers = _resolve(committed, headers["$ref"])["headers"]
    assert headers["required"] == [dlq.MSG_ID]


def test_commit_notices_and_status_events_are_typed(committed) -> None:
    notices = _messages_on(committed, "memq.v1.changed.")
    assert notices
    for ref in notices.values():
        _validate(committed, ref, orjson.loads(CommitNotice(app="a", user="u", session="s", seq=3).encode()))
    statuses = _messages_on(committed, "memq.v1.status.")
    assert statuses
    for ref in statuses.values():
        _validate(committed, ref, orjson.loads(StatusEvent(app="a", user="u", session="s", state="failed").encode()))
        with pytest.raises(jsonschema.ValidationError):
            _validate(committed, ref, {"app": "a", "user": "u", "session": "s", "state": "asleep"})


def test_dead_letters_carry_the_headers_of_the_dlq_protocol(committed) -> None:
    (ref,) = _messages_on(committed, "memq.v1.dlq.").values()
    message = _resolve(committed, _resolve(committed, ref)["$ref"])
    written = dlq.DeadLetterHeaders("persistence", "invalid_message", "bad", "memq.v1.ev.a.u.s", 7)
    headers = written.to_headers("MEMQ_EVENTS")
    assert set(message["headers"]["properties"]) == set(headers)
    jsonschema.Draft202012Validator(message["headers"]).validate(headers)
    assert committed["operations"]["dlq"]["action"] == "send"
