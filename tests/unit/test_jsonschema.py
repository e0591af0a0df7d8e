"""The committed JSON Schema files are current, and our own messages satisfy them."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest

from memq.contracts import jsonschema as export_schemas
from memq.contracts.codec import encode
from memq.contracts.schemas import KINDS, Event, EventAppended, Message, TextPart

from test_codec import MESSAGES

COMMITTED = export_schemas.DEFAULT_DIR


def _load(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_committed_files_equal_a_fresh_export(tmp_path) -> None:
    fresh = {p.name: _load(p) for p in export_schemas.export(tmp_path)}
    committed = {p.name: _load(p) for p in COMMITTED.glob("*.schema.json")}
    assert committed == fresh, "schemas are stale: run `python -m memq.contracts.jsonschema`"
    assert len(fresh) == len(KINDS) + 1


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
