"""Hypothesis strategies for the bad-input suite (``test_bad_input.py``).

Pure: no I/O. A strategy yields a *case*: what to publish (or request) and
what the fuzzer knows about it. Cases are built valid (they must commit, or
be answered), built broken (they must be refused with a typed error), or
mutated from a valid one, when they may or may not still be valid: then the
contract's own decoder is the oracle, and the suite checks that the running
system agrees with it end to end.
"""

from __future__ import annotations

import base64
import json
import string
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from hypothesis import strategies as st
from pydantic import ValidationError

from memq.contracts import queries as q
from memq.contracts.codec import encode, msg_id, subject_for
from memq.contracts.errors import MemqError
from memq.contracts.ids import MAX_ID_BYTES, decode_token, encode_token
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
from memq.contracts.subjects import PREFIX, events_subject

# --- hostile strings ------------------------------------------------------------

UNICODE_EDGES = [
    "\x00",
    "a\x00b",
    "\x01\x02\x7f\x1b[31m",
    "\u200f\u202eevil\u202c",
    "e\u0301\u0302\u0303",
    "Z" + "\u0336\u0335\u0334\u0337" * 50,  # one grapheme cluster of 201 code points
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1eb\U0001f1f7",
    "\U0001f642",
    "\ufffe",
    "\uffff",
    "\U0010ffff",
    "\U0001fffe",
    "\ufdd0",
    "\ufeffbom",
    "\u2028\u2029",
    "\u0085",
    "\uff0e",
    "\uff4d\uff45\uff4d\uff51",
    "\u0130\u0131",
    "\u00df",
    "\u00a0",
    "\u3000",
    "\U0001d54f",
    "\t",
    " ",
    "  padded  ",
    "a\r\nb",
    "\r\n",
    "\n",
    "tail\n",
    "\r",
    "a  b",
    "a\tb",
]
INJECTIONS = [
    "'; DROP TABLE events; --",
    "' OR '1'='1",
    "Robert'); DROP TABLE memq_events;--",
    "\\'; --",
    "../../etc/passwd",
    "..\\..\\windows\\win.ini",
    "/",
    "..",
    ".",
    "*",
    ">",
    "a.b",
    "a.*.>",
    "*.>",
    "memq.v1.ev.>",
    "$JS.API.STREAM.DELETE.MEMQ_EVENTS",
    "_INBOX.x",
    "~",
    "~41",
    "~ZZ",
    "~~",
    "a b",
    "x\r\nNats-Msg-Id: forged",
    "x\r\nMemq-Error-Code: forged\r\n\r\nbody",
    '{"v":1,"kind":"event"}',
    '"}]',
    "{{template}}",
    "{user:name}",
    "{app:secret?}",
    "{",
    "}",
    "${jndi:ldap://x/a}",
    "%s%n%x",
    "<script>alert(1)</script>",
    "\\",
    "null",
    "NULL",
    "true",
    "0",
    "-1",
    "NaN",
    "Infinity",
]
HOSTILE = UNICODE_EDGES + INJECTIONS


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8"))


def hostile_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Strings a careless system mishandles (all encodable as UTF-8)."""
    odd = st.characters(codec="utf-8", categories=("Cc", "Cf", "Cn", "Co", "Mn", "Zl", "Zp", "Zs", "So"))
    return st.one_of(
        st.sampled_from(HOSTILE),
        st.lists(st.sampled_from(HOSTILE), min_size=2, max_size=4).map("".join),
        st.text(odd, min_size=1, max_size=max_size),
        st.text(max_size=max_size),
    )


def _fits(s: str) -> bool:
    # An id (or state key, or file name): 1..256 bytes of UTF-8, no NUL (SQL text).
    return 1 <= _utf8_len(s) <= MAX_ID_BYTES and "\x00" not in s


LIMIT_IDS = ["x" * MAX_ID_BYTES, "\u00e9" * (MAX_ID_BYTES // 2), "\U0001f642" * (MAX_ID_BYTES // 4)]
valid_ids = st.one_of(hostile_text().filter(_fits), st.sampled_from(LIMIT_IDS))
# Deletes are fuzzed inside their own namespace, so that they never remove
# what other cases committed (the suite checks every commit afterwards).
DELETED = "deleted/"
live_ids = valid_ids.filter(lambda s: not s.startswith(DELETED))
deleted_ids = valid_ids.map(lambda s: (DELETED + s).encode()[:MAX_ID_BYTES].decode("utf-8", "ignore"))

TOO_LONG_IDS = ["x" * (MAX_ID_BYTES + 1), "\u00e9" * (MAX_ID_BYTES // 2 + 1), "\U0001f642" * 65, "i" * 5000]
NOT_STRINGS: list[Any] = [0, -1, 1.5, True, False, None, [], {}, ["a"], {"id": "a"}]
bad_ids = st.sampled_from(["", "\x00", "a\x00b", *TOO_LONG_IDS, *NOT_STRINGS])
# JSON values keep integers of 64 bits (signed or not); beyond, only as mutations.
INTS_64 = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
BIG_INTS = INTS_64 + [2**64, 2**64 + 1, -(2**63) - 1, 10**30, -(10**30)]

# --- JSON values ------------------------------------------------------------------

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from(INTS_64),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text(),
)
json_values = st.recursive(
    json_leaves,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(hostile_text(20), kids, max_size=3)),
    max_leaves=8,
)
json_objects = st.dictionaries(hostile_text(20), json_values, max_size=3)
# Valid timestamps are dates of years 1..9999; beyond, only as mutations.
FIRST_SECOND, LAST_SECOND = -62_135_596_800, 253_402_300_799
timestamps = st.one_of(
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
    st.sampled_from([0.0, -0.0, -1.0, 5e-324, float(FIRST_SECOND), float(LAST_SECOND)]),
)
HUGE_NUMBERS = [1e308, -1e308, 2.0**53, float(LAST_SECOND + 1), float(FIRST_SECOND - 1)]
state_keys = st.tuples(st.sampled_from(["", "", "user:", "app:", "temp:"]), valid_ids).map("".join).filter(_fits)
scoped_keys = st.tuples(st.sampled_from(["user:", "app:", "temp:"]), valid_ids).map("".join).filter(_fits)
deltas = st.dictionaries(state_keys, json_values, max_size=4)


# --- valid stream messages ----------------------------------------------------------


def _parts():
    text = st.one_of(hostile_text(), st.sampled_from(["", "x" * 3000, "\U0001f642" * 500]))
    return st.one_of(
        st.builds(TextPart, text=text),
        st.builds(DataPart, data=json_objects),
        st.builds(ToolCallPart, id=hostile_text(), name=hostile_text(), args=json_objects),
        st.builds(ToolResultPart, id=hostile_text(), name=hostile_text(), result=json_values, is_error=st.booleans()),
        st.builds(FilePart, uri=hostile_text(), mime_type=hostile_text(), name=hostile_text()),
    )


events = st.builds(
    Event,
    id=valid_ids,
    invocation_id=hostile_text(),
    author=hostile_text(),
    branch=hostile_text(),
    message=st.none()
    | st.builds(
        Message, role=st.sampled_from(["user", "assistant", "system", "tool"]), parts=st.lists(_parts(), max_size=3)
    ),
    actions=st.builds(
        Actions,
        state_delta=deltas,
        artifact_delta=st.dictionaries(
            hostile_text(), st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=2
        ),
        transfer_to_agent=st.none() | hostile_text(),
        escalate=st.none() | st.booleans(),
    ),
    timestamp=timestamps,
    metadata=json_objects,
)


@st.composite
def valid_messages(draw, app: str | None = None):
    """One valid message of any kind, with hostile but legal content."""
    app = app if app is not None else draw(valid_ids)
    kind = draw(st.sampled_from(KINDS))
    user = draw(live_ids)
    session = draw(live_ids)
    ids = dict(id=draw(valid_ids), timestamp=draw(timestamps))
    if kind == "event":
        return EventAppended(app=app, user=user, session=session, event=draw(events))
    if kind == "session.create":
        return SessionCreated(app=app, user=user, session=session, state=draw(deltas), **ids)
    if kind == "session.delete":
        return SessionDeleted(app=app, user=user, session=draw(deleted_ids), **ids)
    if kind == "event.forget":  # in the deletes' namespace too: it must not take other cases' events
        seq = draw(st.integers(min_value=1, max_value=2**63 - 1))
        return EventForgotten(app=app, user=user, session=draw(deleted_ids), seq=seq, **ids)
    if kind == "user.delete":
        return UserDeleted(app=app, user=draw(deleted_ids), **ids)
    if kind == "state.set":
        if draw(st.booleans()):
            return StateSet(app=app, user=user, session=session, delta=draw(deltas), **ids)
        return StateSet(app=app, user=user, delta=draw(st.dictionaries(scoped_keys, json_values, max_size=4)), **ids)
    if kind == "artifact.save":
        filename = draw(valid_ids)
        mime = draw(st.sampled_from(["text/plain", "application/octet-stream"]) | hostile_text())
        if draw(st.booleans()):
            body = dict(inline=draw(st.binary(max_size=300)))
        else:
            sha = draw(st.text("0123456789abcdef", min_size=64, max_size=64))
            size = draw(st.integers(min_value=0, max_value=2**63 - 1))
            bucket = draw(
                st.just("MEMQ_ARTIFACTS")
                | st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=64)
            )
            name = draw(hostile_text().filter(lambda n: "\x00" not in n))
            body = dict(object=ObjectRef(bucket=bucket, name=name, size=size, sha256=sha))
        return ArtifactSaved(app=app, user=user, session=session, filename=filename, mime_type=mime, **body, **ids)
    up_to = draw(st.integers(min_value=1, max_value=2**63 - 1))
    summary = draw(st.one_of(hostile_text(), st.just("s" * 5000)))
    return CheckpointSaved(
        app=app,
        user=user,
        session=session,
        summary=summary,
        up_to_seq=up_to,
        author=draw(hostile_text()),
        metadata=draw(json_objects),
        **ids,
    )


# --- cases ------------------------------------------------------------------------

Expect = Literal["commit", "reject", "either", "refuse"]


@dataclass(frozen=True)
class StreamCase:
    """One message to publish raw onto ``MEMQ_EVENTS``.

    ``expect``: ``commit`` (built valid), ``reject`` (built broken: a DLQ
    entry, with ``code`` if known), ``either`` (a mutation: the contract's
    decoder decides), ``refuse`` (too large: the publish itself must fail).
    ``msg_id`` is the Nats-Msg-Id header sent (None: no header)."""

    label: str
    subject: str
    payload: bytes
    expect: Expect
    msg_id: str | None = None
    code: str | None = None
    message: Any = None  # the valid message, for expect == "commit"

    @property
    def headers(self) -> dict[str, str] | None:
        return None if self.msg_id is None else {"Nats-Msg-Id": self.msg_id}

    def __repr__(self) -> str:  # hypothesis prints failing batches: keep megabytes out
        return f"<{self.label}: {self.subject[:60]!r} {self.payload[:80]!r}… ({len(self.payload)} bytes)>"

    def _repr_pretty_(self, p, cycle) -> None:  # what hypothesis' printer calls
        p.text(repr(self))


def _client_header(draw, message) -> str | None:
    # What MemoryClient sends, or no header at all (another producer).
    return msg_id(message) if draw(st.booleans()) else None


def _junk_header(draw) -> str | None:
    """A header for a broken message: none, or a unique hostile one (unique:
    a JetStream dedupe of two broken messages would hide one of them)."""
    choice = draw(st.sampled_from(["none", "unique", "hostile"]))
    if choice == "none":
        return None
    # Not drawn: hypothesis repeats drawn values on purpose, and the wire
    # strips a header's leading whitespace, so a hostile prefix of blanks
    # plus a repeated uuid made two "unique" ids one (a false silent loss).
    tag = f"fuzz-{uuid.uuid4()}"
    return tag if choice == "unique" else draw(hostile_text(20)) + tag


@st.composite
def valid_cases(draw, app: str | None = None):
    message = draw(valid_messages(app))
    return StreamCase(
        f"valid {message.kind}",
        subject_for(message),
        encode(message),
        "commit",
        _client_header(draw, message),
        message=message,
    )


# JSON-level mutations of a valid message -------------------------------------------

WRONG_TYPES: list[Any] = [0, -1, 1.5, True, None, "s", "", [], {}, [1, "a"], {"x": 1}, 2**64, 10**30, -(2**63) - 1]


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield prefix + (i,)
            yield from _paths(value, prefix + (i,))


def _parent(doc, path):
    node = doc
    for step in path[:-1]:
        node = node[step]
    return node


def mutate_document(draw, doc: dict, max_bytes: int) -> str:
    """Mutate one field of a JSON document in place; return what was done."""
    paths = list(_paths(doc))
    path = draw(st.sampled_from(paths))
    parent, last = _parent(doc, path), path[-1]
    where = ".".join(map(str, path))
    op = draw(
        st.sampled_from(
            ["delete", "null", "wrong_type", "hostile", "huge_string", "bad_id", "big_number", "extra", "surrogate"]
        )
    )
    if op == "delete":
        del parent[last]
    elif op == "null":
        parent[last] = None
    elif op == "wrong_type":
        current = parent[last]
        parent[last] = draw(st.sampled_from([v for v in WRONG_TYPES if type(v) is not type(current)]))
    elif op == "hostile":
        parent[last] = draw(hostile_text())
    elif op == "huge_string":
        size = draw(st.sampled_from([300, 5000, max_bytes // 2, max_bytes + 1]))
        parent[last] = (draw(st.sampled_from(HOSTILE)) * size)[:size] or "x" * size
    elif op == "bad_id":
        parent[last] = draw(bad_ids)
    elif op == "big_number":
        parent[last] = draw(st.sampled_from(BIG_INTS + HUGE_NUMBERS + [-1, 0]))
    elif op == "surrogate":
        parent[last] = draw(st.sampled_from(["\ud800", "a\udfffb", "\udbff\udbff"]))
    else:  # extra: a field no schema has, in the dict at or above the path
        target = parent[last] if isinstance(parent[last], dict) else (parent if isinstance(parent, dict) else doc)
        target[draw(st.sampled_from(["extra", "__proto__", "$where", "constructor"]) | hostile_text(10))] = draw(
            json_values
        )
    return f"{op} at {where}"


def dump_document(draw, doc) -> bytes:
    # json (not orjson): it writes ints past 64 bits, and, without
    # ensure_ascii, lone surrogates as the invalid UTF-8 bytes they become.
    return json.dumps(doc, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@st.composite
def mutated_cases(draw, max_bytes: int):
    message = draw(valid_messages())
    doc = orjson.loads(encode(message))
    what = mutate_document(draw, doc, max_bytes)
    header = draw(st.sampled_from(["client", "junk"]))
    msg_id = _client_header(draw, message) if header == "client" else _junk_header(draw)
    # Published where the original belongs: a changed id makes a subject mismatch.
    return StreamCase(f"{message.kind}: {what}", subject_for(message), dump_document(draw, doc), "either", msg_id)


@st.composite
def envelope_cases(draw):
    """Valid JSON of the wrong shape: other kinds, versions, types at the top."""
    message = draw(valid_messages())
    doc = orjson.loads(encode(message))
    op = draw(st.sampled_from(["kind", "version", "no_kind", "no_version", "not_object", "empty"]))
    if op == "kind":
        # Never into or out of a delete (or a forget): a create turned into a delete would
        # remove what other cases committed (deletes have their own namespace).
        deletes = {"session.delete", "user.delete", "event.forget"}
        others = [k for k in KINDS if k != message.kind and not {k, message.kind} & deletes]
        doc["kind"] = draw(
            (st.sampled_from(others) if others else st.nothing()) | hostile_text() | st.sampled_from(WRONG_TYPES)
        )
    elif op == "version":
        doc["v"] = draw(st.sampled_from([0, 2, -1, "1", 1.5, None, 2**64, [1], {"v": 1}]))
    elif op == "no_kind":
        del doc["kind"]
    elif op == "no_version":
        del doc["v"]
    elif op == "not_object":
        doc = draw(st.lists(json_values, max_size=3) | json_leaves)
    else:
        doc = {}
    return StreamCase(
        f"envelope {op} ({message.kind})", subject_for(message), dump_document(draw, doc), "either", _junk_header(draw)
    )


# Byte-level damage ------------------------------------------------------------------

INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\x80"]


@st.composite
def byte_cases(draw):
    message = draw(valid_messages())
    data = encode(message)
    op = draw(st.sampled_from(["random", "truncate", "flip", "invalid_utf8", "bom", "trailing", "nested_json"]))
    if op == "random":
        data = draw(
            st.binary(max_size=200) | st.lists(st.sampled_from(INVALID_UTF8), min_size=1, max_size=5).map(b"".join)
        )
    elif op == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif op == "flip":
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    elif op == "invalid_utf8":
        quotes = [i for i, b in enumerate(data) if b == ord('"')]
        i = draw(st.sampled_from(quotes)) + 1
        data = data[:i] + draw(st.sampled_from(INVALID_UTF8)) + data[i:]
    elif op == "bom":
        data = b"\xef\xbb\xbf" + data
    elif op == "trailing":
        data = data + draw(st.sampled_from([b"x", b"{}", b"\x00", b"\n\n", b",", b"]"]))
    else:  # the message as a JSON string inside JSON
        data = orjson.dumps(data.decode())
    return StreamCase(f"bytes {op} ({message.kind})", subject_for(message), data, "either", _junk_header(draw))


# Subjects ---------------------------------------------------------------------------


@st.composite
def subject_cases(draw):
    """A valid payload on a captured subject that does not name its ids."""
    message = draw(valid_messages())
    session = getattr(message, "session", None)
    base = events_subject(message.app, message.user)
    op = draw(st.sampled_from(["other_user", "other_session", "no_session", "extra_token", "bad_token", "long_token"]))
    if op == "other_user":
        other = "other" if message.user != "other" else "another"
        subject, code = events_subject(message.app, other, session), "subject_mismatch"
    elif op == "other_session":
        other = "other" if session != "other" else "another"
        subject, code = events_subject(message.app, message.user, other), "subject_mismatch"
    elif op == "no_session":
        subject, code = (base if session else f"{base}.s"), "subject_mismatch"
    elif op == "extra_token":
        subject, code = events_subject(message.app, message.user, session or "s") + ".extra", "invalid_id"
    elif op == "bad_token":
        token = draw(st.sampled_from(["~ZZ", "~4", "~FF", "~C3~28", "~41", "a~", "~7e", "~7E~7E~"]))
        subject, code = f"{PREFIX}.ev.{token}.{encode_token(message.user)}", "invalid_id"
    else:  # a token that decodes to more than 256 bytes
        subject, code = f"{PREFIX}.ev.{'a' * (MAX_ID_BYTES + 1)}.{encode_token(message.user)}", "invalid_id"
    return StreamCase(
        f"subject {op} ({message.kind})", subject, encode(message), "reject", _junk_header(draw), code=code
    )


# Size -------------------------------------------------------------------------------


@st.composite
def size_cases(draw, max_bytes: int, max_payload: int):
    """An event of a given size around the limits: the worker's (dead-lettered
    as oversize), the stream's (twice that: the publish fails), NATS' own."""
    app, user, session = draw(live_ids), draw(live_ids), draw(live_ids)
    target = draw(st.sampled_from(["under", "over", "over_stream", "over_nats"]))
    size = {"under": max_bytes - 2048, "over": max_bytes + max_bytes // 2, "over_stream": 2 * max_bytes + 1024}.get(
        target, max_payload + 1
    )
    filler = draw(st.sampled_from(["x", "\U0001f642", "\u00e9", "\x00", "\\"]))
    text = (filler * size)[: size // max(1, len(json.dumps(filler)) - 2)]
    event = Event(id=draw(valid_ids), message=Message(role="user", parts=[TextPart(text=text)]))
    message = EventAppended(app=app, user=user, session=session, event=event)
    data = encode(message)
    if len(data) > 2 * max_bytes:
        expect, code = "refuse", None
    elif len(data) > max_bytes:
        expect, code = "reject", "oversize"
    else:
        expect, code = "commit", None
    header = msg_id(message) if expect == "commit" else _junk_header(draw)
    return StreamCase(f"size {target} ({len(data)} bytes)", subject_for(message), data, expect, header, code, message)


def stream_cases(max_bytes: int, max_payload: int) -> st.SearchStrategy[StreamCase]:
    return st.one_of(
        valid_cases(),
        valid_cases(),
        mutated_cases(max_bytes),
        mutated_cases(max_bytes),
        envelope_cases(),
        byte_cases(),
        subject_cases(),
        size_cases(max_bytes, max_payload),
    )


# --- requests ------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestCase:
    """One raw request to ``memq.v1.q.<app_token>.<op>``. ``expect``: ``answer``
    (built valid), ``refuse`` (built broken), ``either`` (a mutation),
    ``no_responder`` (an op no worker serves)."""

    label: str
    op: str
    app_token: str
    body: bytes
    expect: Literal["answer", "refuse", "either", "no_responder"]

    @property
    def subject(self) -> str:
        return f"{PREFIX}.q.{self.app_token}.{self.op}"

    def __repr__(self) -> str:
        return f"<{self.label}: {self.subject[:60]!r} {self.body[:120]!r}… ({len(self.body)} bytes)>"

    _repr_pretty_ = StreamCase._repr_pretty_


strategy_specs = st.builds(
    dict,
    kind=st.sampled_from(["all", "none", "buffer_window", "token_window", "summary_buffer"]),
    window=st.integers(1, 50),
    budget=st.integers(1, 20_000),
    preserve_recent=st.integers(0, 10),
    threshold=st.sampled_from([0.5, 0.85, 1.0]),
    target=st.sampled_from([0.1, 0.7, 1.0]),
    min_recent=st.integers(0, 10),
    recall_share=st.sampled_from([0.0, 0.5, 0.9]),
).map(lambda d: {k: v for k, v in d.items() if v is not None})
models = st.sampled_from(["gpt-4o", "gpt-3.5-turbo", "cl100k_base", "o200k_base", "llama-3"]) | hostile_text().filter(
    lambda s: len(s) <= 128
)


def _op_fields(op: str, users, sessions) -> st.SearchStrategy[dict]:
    user, session = users, sessions

    def optional(s):
        return st.none() | s

    fields = {
        "session.get": dict(
            user=user,
            session=session,
            events=st.booleans(),
            num_recent_events=optional(st.integers(0, 100)),
            after_seq=optional(st.integers(0, 2**63 - 1)),
        ),
        "sessions.list": dict(
            user=optional(user),
            limit=st.integers(1, q.MAX_PAGE),
            cursor=optional(hostile_text().filter(lambda s: len(s) <= 512)),
        ),
        "state.get": dict(user=user, session=optional(session)),
        "history": dict(user=user, session=session, strategy=optional(strategy_specs), model=optional(models)),
        "context": dict(
            user=user,
            session=session,
            strategy=optional(strategy_specs),
            model=optional(models),
            format=st.sampled_from(["memq", "openai"]),
            instruction=optional(hostile_text()),
            recall_limit=st.integers(0, 5),
            message=optional(hostile_text()),
        ),
        "artifacts.list": dict(user=user, session=session),
        "artifacts.get": dict(
            user=user,
            session=session,
            filename=hostile_text().filter(lambda f: f and "\x00" not in f),
            version=optional(st.integers(0, 2**63 - 1)),
        ),
        "search": dict(
            user=user,
            query=hostile_text().filter(bool),
            session=optional(session),
            mode=st.sampled_from(["keyword", "vector", "hybrid"]),
            k=st.integers(1, q.MAX_K),
            roles=st.lists(st.sampled_from(["user", "assistant", "system", "tool", "summary"]), max_size=2),
        ),
        "facts": dict(
            user=user,
            query=optional(hostile_text().filter(lambda t: bool(t) and len(t) <= 8192)),
            include_invalid=st.booleans(),
            limit=st.integers(1, q.MAX_K),
        ),
        "facts.profile": dict(user=user),
        "facts.history": dict(user=user, fact_id=st.from_regex(r"\A[0-9a-f]{32}\Z")),
    }[op]
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not None})


@st.composite
def valid_request_docs(draw, app: str, users, sessions):
    op = draw(st.sampled_from(tuple(q.OPS)))
    doc = {"v": 1, "app": app, **draw(_op_fields(op, users, sessions))}
    if draw(st.integers(0, 4)) == 0:  # read-your-writes, kept short: a long wait only slows the suite
        doc.update(min_seq=draw(st.integers(1, 3)), wait_ms=draw(st.integers(0, 200)))
    return op, doc


@st.composite
def request_cases(draw, app: str, users: st.SearchStrategy[str], sessions: st.SearchStrategy[str]):
    op, doc = draw(valid_request_docs(app, users, sessions))
    token = encode_token(app)
    kind = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "envelope", "bytes", "app", "unknown_op"]))
    if kind == "valid":
        return RequestCase(f"valid {op}", op, token, orjson.dumps(doc), "answer")
    if kind == "mutated":
        what = mutate_document(draw, doc, 200_000)  # the longest text field a request takes
        if type(doc.get("wait_ms")) is int and doc["wait_ms"] > 200:
            doc["wait_ms"] = 200  # a mutated min_seq may wait that long for nothing
        return RequestCase(f"{op}: {what}", op, token, dump_document(draw, doc), "either")
    if kind == "envelope":
        which = draw(st.sampled_from(["version", "not_object", "empty"]))
        if which == "version":
            doc["v"] = draw(st.sampled_from([0, 2, "1", 1.5, None, 2**64, True]))
        body = dump_document(draw, {} if which == "empty" else doc if which == "version" else draw(json_values))
        return RequestCase(f"{op}: envelope {which}", op, token, body, "either")
    if kind == "bytes":
        body = draw(
            st.binary(max_size=100) | st.lists(st.sampled_from(INVALID_UTF8), min_size=1, max_size=4).map(b"".join)
        )
        return RequestCase(f"{op}: random bytes", op, token, body, "either")
    if kind == "app":  # the subject's app against the body's
        which = draw(st.sampled_from(["other_app", "hostile_app", "bad_token"]))
        if which == "other_app":
            return RequestCase(
                f"{op}: body names another app",
                op,
                encode_token(draw(valid_ids.filter(lambda a: a != app))),
                orjson.dumps(doc),
                "refuse",
            )
        if which == "hostile_app":  # a legal hostile app, the same in subject and body
            other = draw(valid_ids)
            return RequestCase(
                f"{op}: hostile app", op, encode_token(other), orjson.dumps({**doc, "app": other}), "either"
            )
        bad = draw(st.sampled_from(["~ZZ", "~41pp", "~FF", "~2A", "a" * (MAX_ID_BYTES + 1), "~", "a~4"]))
        return RequestCase(f"{op}: bad app token {bad[:12]!r}", op, bad, orjson.dumps(doc), "refuse")
    unknown = draw(
        st.sampled_from(["drop", "session.delete", "history.extra", "events", "sessions", "_admin", "*", ">"])
    )
    return RequestCase(f"unknown op {unknown!r}", unknown, token, orjson.dumps(doc), "no_responder")


def request_verdict(op: str, app_token: str, body: bytes) -> tuple[bool, str]:
    """What the contract says of a raw request: ``(valid, why)``."""
    try:
        app = decode_token(app_token, "app")
        raw = orjson.loads(body)
    except (MemqError, orjson.JSONDecodeError) as exc:
        return False, str(exc)
    if not isinstance(raw, dict) or raw.get("v") != q.QUERY_VERSION:
        return False, "not a v1 JSON object"
    try:
        req = q.OPS[op].request.model_validate(raw)
    except (ValidationError, MemqError) as exc:
        return False, str(exc)
    if req.app != app:
        return False, "another app"
    return True, ""


# --- regressions: what this fuzzer found, replayed first on every run -----------------


def _raw(label: str, message, doc_change=None, msg_id: str | None = None, expect: Expect = "reject") -> StreamCase:
    doc = orjson.loads(encode(message))
    if doc_change is not None:
        doc_change(doc)
    return StreamCase(label, subject_for(message), json.dumps(doc).encode(), expect, msg_id)


def _valid(label: str, message) -> StreamCase:
    return StreamCase(label, subject_for(message), encode(message), "commit", msg_id(message), message=message)


def stream_regressions() -> list[StreamCase]:
    scope = dict(app="reg-app", user="reg-user", session="reg-session")
    text = Message(role="user", parts=[TextPart(text="hi")])

    def event(eid, **kw):
        return EventAppended(**scope, event=Event(id=eid, message=text, **kw))

    def put(path, value):
        def change(doc):
            node = doc
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = value

        return change

    ids = [event("dup-1"), event("dup-1\t"), event("dup-1\r\n"), event(" dup-1")]
    return [
        # A list or dict as "v" raised TypeError in decode: the batch failed forever.
        _raw("v is a list", event("reg-v-list"), put(["v"], [1])),
        _raw("v is a dict", event("reg-v-dict"), put(["v"], {"v": 1})),
        _raw("v is true", event("reg-v-true"), put(["v"], True)),
        # A date out of datetime's range stopped the indexing worker forever.
        _raw("timestamp 1e308", event("reg-ts"), put(["event", "timestamp"], 1e308)),
        # Integers past 64 bits: accepted, then refused by the store's encoder.
        _raw("state value 2**64", event("reg-int"), put(["event", "actions", "state_delta"], {"k": 2**64})),
        # NUL: accepted, then refused by PostgreSQL.
        _raw("NUL in session", event("reg-nul"), put(["session"], "a\x00b")),
        _raw("NUL in a state key", event("reg-nul-key"), put(["event", "actions", "state_delta"], {"a\x00": 1})),
        _valid("NUL in author (kept as U+FFFD in the column)", event("reg-nul-author", author="a\x00b")),
        # CR/LF in the kind forged lines in the worker's log.
        _raw("CRLF in kind", event("reg-crlf"), put(["kind"], "x\r\nMemq-Error-Code: forged")),
        # Ids that differ only in whitespace shared one Nats-Msg-Id: all but one were dropped.
        *[_valid(f"id {m.event.id!r}", m) for m in ids],
    ]


def request_regressions(app: str, user: str, session: str) -> list[RequestCase]:
    base = {"v": 1, "app": app, "user": user, "session": session}
    token = encode_token(app)
    cursor_with_nul = base64.urlsafe_b64encode(orjson.dumps([1.0, "a" * 63 + "\x00"])).decode()
    return [
        # NUL reached PostgreSQL: an untyped "internal" reply.
        RequestCase("NUL filename", "artifacts.get", token, orjson.dumps({**base, "filename": "a\x00"}), "refuse"),
        RequestCase(
            "NUL in a cursor's key",
            "sessions.list",
            token,
            orjson.dumps({"v": 1, "app": app, "cursor": cursor_with_nul}),
            "either",
        ),
        # The error quoted a 300 kB "v": a reply over max_payload never arrived.
        RequestCase("huge v", "history", token, orjson.dumps({**base, "v": "\u2028" * 300_000}), "refuse"),
    ]
