"""Encoding of stream messages, and the typed error for each kind of bad input."""

from __future__ import annotations

import orjson
import pytest

from memq.contracts.codec import decode, decode_from_subject, encode, subject_for
from memq.contracts.errors import InvalidId, InvalidMessage, Oversize, SubjectMismatch, UnsupportedVersion
from memq.contracts.schemas import (
    KINDS,
    Actions,
    ArtifactSaved,
    CheckpointSaved,
    DataPart,
    Event,
    EventAppended,
    EventForgotten,
    FilePart,
    Message,
    ObjectRef,
    SessionCreated,
    SessionDeleted,
    StateSet,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    UserDeleted,
)
from memq.contracts.subjects import events_subject

SCOPE = {"app": "app.one", "user": "user ✓", "session": "s/1"}
USER_SCOPE = {"app": "app.one", "user": "user ✓"}

EVENT = Event(
    invocation_id="inv-1",
    author="planner",
    branch="root.planner",
    message=Message(
        role="assistant",
        parts=[
            TextPart(text="looking it up"),
            DataPart(data={"k": [1, 2]}),
            ToolCallPart(id="c1", name="search", args={"q": "x"}),
            ToolResultPart(id="c1", name="search", result={"hits": 3}),
            FilePart(uri="memq://a/b", mime_type="text/plain", name="b.txt"),
        ],
    ),
    actions=Actions(state_delta={"topic": "x", "user:lang": "fr"}, artifact_delta={"b.txt": 2}, escalate=True),
    metadata={"model": "m"},
)

MESSAGES = [
    EventAppended(**SCOPE, event=EVENT),
    SessionCreated(**SCOPE, state={"topic": "x", "app:runs": 1}),
    SessionDeleted(**SCOPE),
    EventForgotten(**SCOPE, seq=3),
    UserDeleted(**USER_SCOPE),
    StateSet(**USER_SCOPE, delta={"user:lang": "fr"}),
    StateSet(**SCOPE, delta={"topic": None}),
    ArtifactSaved(**SCOPE, filename="a.bin", inline=bytes(range(256)) * 3),
    ArtifactSaved(**SCOPE, filename="big.bin", object=ObjectRef(bucket="B", name="k/n", size=9, sha256="0" * 64)),
    CheckpointSaved(**SCOPE, summary="they talked about x", up_to_seq=42),
]


def test_every_kind_is_covered() -> None:
    assert {m.kind for m in MESSAGES} == set(KINDS)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_round_trip(message) -> None:
    data = encode(message)
    assert decode(data) == message
    assert decode_from_subject(subject_for(message), data) == message


def test_inline_bytes_travel_as_base64() -> None:
    message = ArtifactSaved(**SCOPE, filename="a.bin", inline=b"\x00\xff binary")
    raw = orjson.loads(encode(message))
    assert isinstance(raw["inline"], str)
    assert decode(encode(message)).inline == b"\x00\xff binary"


def _raw(**changes) -> bytes:
    """A valid session.delete payload with fields changed (``...`` removes one)."""
    body = orjson.loads(encode(SessionDeleted(**SCOPE)))
    body.update(changes)
    return orjson.dumps({k: v for k, v in body.items() if v is not ...})


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"not json", InvalidMessage),
        (b"", InvalidMessage),
        (b"[1, 2]", InvalidMessage),
        (b'"just a string"', InvalidMessage),
        (_raw(v=...), UnsupportedVersion),
        (_raw(v=2), UnsupportedVersion),
        (_raw(v="1"), UnsupportedVersion),
        (_raw(kind="session.rename"), InvalidMessage),
        (_raw(kind=...), InvalidMessage),
        (_raw(extra_field=1), InvalidMessage),
        (_raw(timestamp="yesterday"), InvalidMessage),
        (_raw(user="x" * 300), InvalidId),
        (_raw(session=""), InvalidId),
    ],
    ids=[
        "not-json",
        "empty",
        "array",
        "string",
        "no-version",
        "version-2",
        "version-str",
        "unknown-kind",
        "no-kind",
        "unknown-field",
        "bad-timestamp",
        "300-byte-user",
        "empty-session",
    ],
)
def test_bad_input_gives_typed_error(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode(data)


@pytest.mark.parametrize(
    "message",
    [
        {"kind": "state.set", "delta": {"topic": 1}},  # session key without a session
        {"kind": "state.set", "delta": {"": 1}, "session": "s"},
        {"kind": "artifact.save", "filename": "f", "session": "s"},  # neither inline nor object
        {"kind": "event", "session": "s", "event": {"id": "e", "message": {"role": "user", "parts": [{"text": "x"}]}}},
    ],
)
def test_invalid_content_is_invalid_message(message: dict) -> None:
    with pytest.raises(InvalidMessage):
        decode(orjson.dumps({"v": 1, "app": "a", "user": "u", **message}))


def test_oversize() -> None:
    data = encode(EventAppended(**SCOPE, event=Event(message=Message(role="user", parts=[TextPart(text="x" * 2000)]))))
    with pytest.raises(Oversize):
        decode(data, max_bytes=1000)
    with pytest.raises(Oversize):
        decode(b"{" + b" " * (1024 * 1024) + b"}")
    assert decode(data, max_bytes=len(data)).kind == "event"


def test_subject_mismatch() -> None:
    data = encode(SessionDeleted(**SCOPE))
    other = {**SCOPE, "session": "another"}
    with pytest.raises(SubjectMismatch):
        decode_from_subject(events_subject(**other), data)
    with pytest.raises(SubjectMismatch):  # a user-level subject for a session message
        decode_from_subject(events_subject(SCOPE["app"], SCOPE["user"]), data)
    with pytest.raises(InvalidId):
        decode_from_subject("memq.v1.ev.only-app", data)


@pytest.mark.parametrize(
    ("message", "where"),
    [
        ({"kind": "event", "session": "s", "event": {"author": "user"}}, "event.id"),
        ({"kind": "session.delete", "session": "s"}, "id"),
    ],
)
def test_missing_id_is_refused_not_made_up(message: dict, where: str) -> None:
    """A made-up id would differ on every redelivery and store duplicates."""
    with pytest.raises(InvalidMessage, match=f"^{where} is required"):
        decode(orjson.dumps({"v": 1, "app": "a", "user": "u", **message}))
