"""The JSON Lines format of `memq export` (version 1), pure: no I/O.

One JSON object per line, UTF-8, ``\\n``-terminated:

1. a header: ``{"memq_export": 1, "schema": 1, "created_at": <unix s>,
   "source": "<sql dialect>", "filter": {"app": …, "user": …, "session": …}}``;
2. one record per stored fact: ``{"seq": <source stream sequence>,
   "message": <a stream message>}``, where ``message`` is exactly what a client
   publishes on ``MEMQ_EVENTS`` (:data:`memq.contracts.schemas.StreamMessage`,
   schema ``v`` 1): ``session.create``, ``event``, ``artifact.save``,
   ``checkpoint`` and ``state.set``. Deletes never appear: deleted sessions
   are not exported;
3. a footer: ``{"memq_export_end": 1, "records": <number of records>}``, so a
   truncated file is told from a complete one.

Records come session by session (a ``session.create`` at the session's
``created_at``, then its events, artifacts and checkpoints in stream order,
then one ``state.set`` holding the session's final state, live keys in
``delta`` and deleted keys in ``delete``, at the session's ``updated_at``),
then each user's final ``user:`` state, then the app's final ``app:`` state.
A state record's ``seq`` is that of the newest write it holds. A checkpoint's
``up_to_seq`` is a source sequence; the importer maps it onto the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson
from pydantic import TypeAdapter, ValidationError

from memq.contracts.schemas import StreamMessage

FORMAT_VERSION: Final = 1
HEADER_KEY: Final = "memq_export"
FOOTER_KEY: Final = "memq_export_end"
# What an export holds: a delete would remove data in the target.
IMPORTED_KINDS = frozenset({"session.create", "event", "artifact.save", "checkpoint", "state.set"})

_MESSAGE: TypeAdapter[StreamMessage] = TypeAdapter(StreamMessage)


class BadLine(ValueError):
    """A line that cannot be imported: says which and why."""

    def __init__(self, lineno: int, reason: str):
        super().__init__(f"line {lineno}: {reason}")
        self.lineno, self.reason = lineno, reason


@dataclass(frozen=True)
class Header:
    lineno: int
    created_at: float
    source: str
    filter: dict[str, Any]


@dataclass(frozen=True)
class Footer:
    lineno: int
    records: int


@dataclass(frozen=True)
class Record:
    lineno: int
    seq: int | None
    message: StreamMessage


def header_line(created_at: float, source: str, filter: dict[str, Any]) -> bytes:
    body = {HEADER_KEY: FORMAT_VERSION, "schema": 1, "created_at": created_at, "source": source, "filter": filter}
    return orjson.dumps(body) + b"\n"


def footer_line(records: int) -> bytes:
    return orjson.dumps({FOOTER_KEY: FORMAT_VERSION, "records": records}) + b"\n"


def record_line(seq: int | None, message_json: bytes) -> bytes:
    """A record around a message already encoded (``codec.encode``, or an
    event's stored JSON), copied as it is rather than parsed again."""
    return orjson.dumps({"seq": seq, "message": orjson.Fragment(message_json)}) + b"\n"


def parse_line(lineno: int, raw: bytes) -> Header | Footer | Record:
    """One line, validated; :class:`BadLine` says what is wrong with it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadLine(lineno, f"not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadLine(lineno, f"expected a JSON object, got {type(body).__name__}")
    if HEADER_KEY in body:
        if body[HEADER_KEY] != FORMAT_VERSION:
            raise BadLine(lineno, f"export format {body[HEADER_KEY]!r} is not supported (supported: {FORMAT_VERSION})")
        return Header(
            lineno, float(body.get("created_at") or 0), str(body.get("source", "")), dict(body.get("filter") or {})
        )
    if FOOTER_KEY in body:
        records = body.get("records")
        if type(records) is not int:
            raise BadLine(lineno, "the footer's 'records' must be an integer")
        return Footer(lineno, records)
    if "message" not in body:
        raise BadLine(lineno, "a record needs 'message' (or is this not a memq export?)")
    seq = body.get("seq")
    if seq is not None and (type(seq) is not int or seq < 0):
        raise BadLine(lineno, f"'seq' must be a non-negative integer or null, got {seq!r}")
    try:
        # validate_json, not _python: artifacts' inline bytes are base64 in JSON.
        message = _MESSAGE.validate_json(orjson.dumps(body["message"]))
    except ValidationError as exc:
        kind = body["message"].get("kind") if isinstance(body["message"], dict) else None
        problems = "; ".join(f"{_where(e['loc'], kind)}: {e['msg']}" for e in exc.errors()[:3])
        raise BadLine(lineno, f"invalid message: {problems}") from None
    if message.kind not in IMPORTED_KINDS:
        raise BadLine(lineno, f"a {message.kind!r} message cannot be imported (an export holds no deletes)")
    return Record(lineno, seq, message)


def _where(loc: tuple, kind: object) -> str:
    # The union's first location is the kind it tried ("event.event.message"):
    # shown without it, the path reads as the message's own fields.
    if loc and loc[0] == kind:
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "<message>"


def check_order(parsed: Header | Footer | Record, *, seen_header: bool, seen_footer: bool) -> None:
    """After the header: records, then the footer, then nothing."""
    lineno = parsed.lineno
    if isinstance(parsed, Header) and seen_header:
        raise BadLine(lineno, "a second header")
    if seen_footer:
        raise BadLine(lineno, "a line after the footer")
