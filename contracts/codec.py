"""JSON encoding (orjson) of stream messages, with typed errors on bad input."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import orjson
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from memq.contracts.errors import InvalidMessage, Oversize, SubjectMismatch, UnsupportedVersion
from memq.contracts.schemas import SUPPORTED_VERSIONS, Event, EventAppended, StreamMessage
from memq.contracts.subjects import dedupe_id, events_subject, parse_events_subject

_ADAPTER: TypeAdapter[StreamMessage] = TypeAdapter(StreamMessage)
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)

DEFAULT_MAX_BYTES = 1024 * 1024  # NATS' default max_payload


def encode(message: StreamMessage) -> bytes:
    """Raise InvalidMessage for a value JSON cannot hold (a lone surrogate,
    bytes that are not UTF-8, an arbitrary object), not pydantic's error."""
    try:
        return _ADAPTER.dump_json(message, exclude_none=True)
    except PydanticSerializationError as exc:
        raise InvalidMessage(f"{message.kind} message cannot be encoded as JSON: {exc}") from None


def _encode_event(event: Event) -> bytes:
    try:
        return _EVENT.dump_json(event, exclude_none=True)
    except PydanticSerializationError as exc:
        raise InvalidMessage(f"event message cannot be encoded as JSON: {exc}") from None


def event_encoder(envelope: EventAppended) -> Callable[[Event], bytes]:
    """``encode(EventAppended(<envelope's app, user, session>, event=e))`` for
    many events of one session, byte for byte, with the envelope serialised
    once: the event is the message's last field, so only its own JSON is new."""
    whole = encode(envelope)
    tail = _encode_event(envelope.event) + b"}"
    if not whole.endswith(tail):  # the schema no longer ends with the event
        return lambda event: encode(envelope.model_copy(update={"event": event}))
    head = whole[: len(whole) - len(tail)]
    return lambda event: b"".join((head, _encode_event(event), b"}"))


def subject_for(message: StreamMessage) -> str:
    return events_subject(message.app, message.user, getattr(message, "session", None))


def msg_id(message: StreamMessage, data: bytes | None = None) -> str:
    """The Nats-Msg-Id the client publishes ``message`` with: :func:`dedupe_id`
    of its subject, its id (an event's own id) and its encoded bytes (``data``
    if already encoded). The id is escaped like a subject token: raw, ids "a"
    and "a\\t" would collide (header values are stripped, CR/LF become
    spaces) and JetStream would drop one."""
    key = message.event.id if isinstance(message, EventAppended) else message.id
    return dedupe_id(subject_for(message), key, encode(message) if data is None else data)


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def decode(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> StreamMessage:
    """Parse and validate one message; raise a typed :class:`MemqError`."""
    if len(data) > max_bytes:
        raise Oversize(f"payload is {len(data)} bytes; the limit is {max_bytes}")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"payload is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidMessage(f"payload must be a JSON object, got {type(raw).__name__}")
    version = raw.get("v")
    # type() first: a list or dict is unhashable (a TypeError here was a poison
    # pill that failed its whole batch forever), and 1.0 or true is not 1.
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(
            f"schema version {version!r} is not supported (supported: {sorted(SUPPORTED_VERSIONS)})"
        )
    # Ids are the idempotency keys: one made up here would differ on every
    # redelivery and turn a duplicate into a new event.
    holder = raw.get("event") if raw.get("kind") == "event" else raw
    if isinstance(holder, dict) and "id" not in holder:
        where = "event.id" if holder is not raw else "id"
        raise InvalidMessage(f"{where} is required on the wire (the idempotency key)")
    try:
        # validate_json (not _python) so that bytes fields decode from base64.
        return _ADAPTER.validate_json(data)
    except ValidationError as exc:
        raise InvalidMessage(_summarise(exc)) from None


# A batch holds few subjects, many times each; a malformed one raises, uncached.
_parse_subject = lru_cache(maxsize=4096)(parse_events_subject)


def decode_from_subject(subject: str, data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> StreamMessage:
    """Decode and check that the payload names the same ids as its subject,
    so that NATS permissions on subjects also fence the payload."""
    scope = _parse_subject(subject)
    message = decode(data, max_bytes=max_bytes)
    named = (message.app, message.user, getattr(message, "session", None))
    if named != scope:
        raise SubjectMismatch(f"payload names {tuple(named)} but was published on {subject!r}")
    return message
