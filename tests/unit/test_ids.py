"""Ids and their subject-token encoding: any 1..256-byte UTF-8 id round-trips."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from memq.contracts.errors import InvalidId
from memq.contracts.ids import MAX_ID_BYTES, decode_token, encode_token, validate_id
from memq.contracts.subjects import Scope, events_subject, parse_events_subject

TOKEN = re.compile(r"[A-Za-z0-9_~-]+")

# Up to 64 characters is at most 256 bytes whatever the characters; long ASCII
# ids (with NATS' special characters) reach the byte limit exactly.
ids = st.one_of(
    st.text(min_size=1, max_size=64),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), min_size=1, max_size=MAX_ID_BYTES),
    st.sampled_from(["a.b", "*", ">", "a b", "~", "~41", "tab\there", "x" * MAX_ID_BYTES, "é" * 128]),
)


@given(ids)
def test_token_round_trips_and_is_a_plain_subject_token(value: str) -> None:
    assert 1 <= len(value.encode("utf-8")) <= MAX_ID_BYTES
    token = encode_token(value)
    assert TOKEN.fullmatch(token)
    assert decode_token(token) == value


@given(ids, ids)
def test_distinct_ids_give_distinct_tokens(a: str, b: str) -> None:
    assume(a != b)
    assert encode_token(a) != encode_token(b)


@given(ids)
def test_non_canonical_tokens_are_refused(value: str) -> None:
    # Escaping a character that stands for itself gives another subject for
    # the same id; decode must refuse it or subject permissions leak.
    units = re.findall(r"~[0-9A-F]{2}|.", encode_token(value))
    literal = next((i for i, u in enumerate(units) if len(u) == 1), None)
    assume(literal is not None)
    units[literal] = f"~{ord(units[literal]):02X}"
    alias = "".join(units)
    with pytest.raises(InvalidId):
        decode_token(alias)


@given(ids, ids, st.none() | ids)
def test_events_subject_round_trips(app: str, user: str, session: str | None) -> None:
    subject = events_subject(app, user, session)
    assert parse_events_subject(subject) == Scope(app, user, session)


@pytest.mark.parametrize(
    "value",
    ["", "x" * (MAX_ID_BYTES + 1), "x" * 255 + "é", "\ud800", "ok\udfff", None, 7, b"bytes", ["a"]],
    ids=[
        "empty",
        "257-ascii",
        "257-bytes-utf8",
        "lone-surrogate",
        "trailing-surrogate",
        "none",
        "int",
        "bytes",
        "list",
    ],
)
def test_invalid_ids_raise(value: object) -> None:
    with pytest.raises(InvalidId):
        validate_id(value)
    with pytest.raises(InvalidId):
        encode_token(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "token",
    [
        "",
        "a.b",
        "a b",
        "*",
        ">",
        "abc\n",
        "~",
        "~4",
        "~4G",
        "~c3~a9",  # lower-case hex is not what encode produces
        "~FF",  # not UTF-8
        "~C3",  # truncated UTF-8
        "~ED~A0~80",  # an encoded surrogate
        "~41",  # "A" escaped: non-canonical
        "x" * (MAX_ID_BYTES + 1),
        "~C3~A9" * 129,  # 258 bytes once decoded
    ],
)
def test_malformed_tokens_raise(token: str) -> None:
    with pytest.raises(InvalidId):
        decode_token(token)


@pytest.mark.parametrize(
    "subject",
    ["memq.v1.ev.app", "memq.v1.ev.a.u.s.extra", "memq.v2.ev.a.u", "other.v1.ev.a.u", "memq.v1.ev.a~.u"],
)
def test_parse_events_subject_refuses_other_subjects(subject: str) -> None:
    with pytest.raises(InvalidId):
        parse_events_subject(subject)
