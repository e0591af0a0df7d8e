"""A reply's JSON is pydantic's, byte for byte, whether orjson or pydantic
writes it (contracts/replies.py writes with orjson where that is the same)."""

from __future__ import annotations

import datetime
import enum

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_serializer
from test_jsonschema import REPLIES

from memq.contracts import queries as q
from memq.contracts import replies
from memq.contracts.replies import ok_body, parse_reply


def pydantic_body(result: BaseModel) -> bytes:
    return b'{"ok":true,"result":' + result.model_dump_json().encode() + b"}"


def written_by_orjson(result: BaseModel, monkeypatch) -> bool:
    fell_back = []
    real = type(result).model_dump_json
    monkeypatch.setattr(type(result), "model_dump_json", lambda self, **kw: fell_back.append(1) or real(self, **kw))
    ok_body(result)
    monkeypatch.undo()
    return not fell_back


@pytest.mark.parametrize("op", sorted(REPLIES))
def test_every_op_reply_is_pydantics_json(op, monkeypatch):
    reply = REPLIES[op]
    assert ok_body(reply) == pydantic_body(reply)
    assert parse_reply(op, ok_body(reply)) == reply
    # bytes (base64 in pydantic's JSON) are pydantic's to write; the rest is orjson's
    assert written_by_orjson(reply, monkeypatch) == (op != "artifacts.get")


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.lists(st.dictionaries(st.text(max_size=8), JSON, max_size=4), max_size=6), st.integers(0, 10**6))
def test_a_context_of_any_json_is_pydantics_json(messages, total):
    view = q.ContextView(format="openai", tokens={"total": total}, messages=messages, budget=total, note="ñ ✓")
    assert orjson.loads(ok_body(view)) == orjson.loads(pydantic_body(view))
    assert ok_body(view) == pydantic_body(view)


class Colour(str, enum.Enum):
    RED = "red"


class Aliased(BaseModel):
    name: str = Field(serialization_alias="Name")


class Serialized(BaseModel):
    n: int

    @field_serializer("n")
    def _double(self, n: int) -> int:
        return 2 * n


@pytest.mark.parametrize(
    "value",
    [
        {"when": datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)},
        {"colour": Colour.RED},
        {"raw": b"ab"},
        {"big": 2**70},
        {"keys": {1: "one"}},
        {"set": {1}},
    ],
    ids=lambda v: next(iter(v)),
)
def test_what_orjson_writes_otherwise_is_left_to_pydantic(value):
    view = q.ContextView(format="openai", tokens={"total": 1}, messages=[value])
    assert ok_body(view) == pydantic_body(view)


@pytest.mark.parametrize("model", [Aliased(name="x"), Serialized(n=2)], ids=lambda m: type(m).__name__)
def test_a_model_with_aliases_or_serializers_is_left_to_pydantic(model):
    assert not replies._dumps_as_fields(type(model))
    assert ok_body(model) == pydantic_body(model)
