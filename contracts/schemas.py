"""Versioned message schemas (docs/design.md, Data model), after Hector/ADK's event model.

Every message on ``MEMQ_EVENTS`` is one JSON object with ``v`` (schema
version) and ``kind``; :data:`StreamMessage` is the tagged union of all kinds.
State keys carry their scope as a prefix: none = session, ``user:``, ``app:``,
``temp:`` (never persisted: every state delta drops its ``temp:`` keys when it
is validated, so no door can store one, see :func:`persisted_state`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Final, Literal

import uuid_utils
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from memq.contracts.errors import InvalidId
from memq.contracts.ids import validate_id
from memq.contracts.vocabulary import Role

SCHEMA_VERSION: Final = 1  # Final: its type is Literal[1], the field type of `v`
SUPPORTED_VERSIONS = frozenset({SCHEMA_VERSION})
MAX_STATE_KEY_BYTES = 256
MAX_FILENAME_BYTES = 256
MAX_SQL_INT = 2**63 - 1  # SQL BIGINT


def new_id() -> str:
    """A time-ordered id (UUIDv7), the default for events and messages."""
    return str(uuid_utils.uuid7())


def _stored_id(value: object, what: str) -> str:
    value = validate_id(value, what)
    # Any UTF-8 fits a subject token, but ids are SQL text too, and
    # PostgreSQL's text types cannot hold NUL.
    if "\x00" in value:
        raise InvalidId(f"{what} must not contain NUL (U+0000): PostgreSQL cannot store it")
    return value


def _id(what: str):
    return AfterValidator(lambda v: _stored_id(v, what))


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (U+0000): PostgreSQL cannot store it")
    return value


def _json_safe(value: Any) -> Any:
    """Refuse integers beyond 64 bits anywhere in a JSON value: the store's
    encoder (orjson) cannot write them and readers would get a float back."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is int:
            if not -(2**63) <= v < 2**64:
                raise ValueError("an integer does not fit in 64 bits")
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return value


AppId = Annotated[str, _id("app")]
UserId = Annotated[str, _id("user")]
SessionId = Annotated[str, _id("session")]
EventId = Annotated[str, _id("event id")]
# Unix seconds that a date can be made of (years 1..9999): workers turn
# timestamps into dates, and datetime raises beyond these.
Timestamp = Annotated[float, Field(ge=-62_135_596_800, le=253_402_300_799)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_safe)]
JsonValue = Annotated[Any, AfterValidator(_json_safe)]
NoNul = Annotated[str, AfterValidator(_no_nul)]


def _check_state_key(key: str) -> str:
    if not key or len(key.encode("utf-8", "surrogatepass")) > MAX_STATE_KEY_BYTES:
        raise ValueError(f"state key {key[:40]!r} must be 1..{MAX_STATE_KEY_BYTES} bytes")
    return _no_nul(key)  # keys are SQL text


TEMP_PREFIX = "temp:"


def persisted_state(delta: dict[str, Any]) -> dict[str, Any]:
    """``delta`` without its ``temp:`` keys, as ADK's session services trim
    an event's delta before storing it: ``temp:`` state lives for one
    invocation in the agent's own session object, never in a store."""
    if not any(k.startswith(TEMP_PREFIX) for k in delta):
        return delta
    return {k: v for k, v in delta.items() if not k.startswith(TEMP_PREFIX)}


def _check_state_keys(delta: dict[str, Any]) -> dict[str, Any]:
    for key in delta:
        _check_state_key(key)
    # In the schema, not at each door: the client, the gateway, MCP, the
    # importer and the persistence worker (for raw publishers) all validate
    # through here, so the stream, SQL, the index and exports never hold one.
    return _json_safe(persisted_state(delta))


def _persisted_keys(keys: list[str] | None) -> list[str] | None:
    """Deletes of ``temp:`` keys go the way of their sets: nothing stored has one."""
    return None if keys is None else [k for k in keys if not k.startswith(TEMP_PREFIX)]


StateDelta = Annotated[dict[str, Any], AfterValidator(_check_state_keys)]
StateKey = Annotated[str, AfterValidator(_check_state_key)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- message parts ---------------------------------------------------------


class TextPart(_Model):
    type: Literal["text"] = "text"
    text: str


class DataPart(_Model):
    type: Literal["data"] = "data"
    data: JsonObject


class ToolCallPart(_Model):
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    args: JsonObject = Field(default_factory=dict)


class ToolResultPart(_Model):
    type: Literal["tool_result"] = "tool_result"
    id: str
    name: str = ""
    result: JsonValue = None
    is_error: bool = False


class FilePart(_Model):
    type: Literal["file"] = "file"
    uri: str
    mime_type: str = "application/octet-stream"
    name: str = ""


Part = Annotated[
    TextPart | DataPart | ToolCallPart | ToolResultPart | FilePart,
    Field(discriminator="type"),
]


class Message(_Model):
    role: Role
    parts: list[Part] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))


class Actions(_Model):
    state_delta: StateDelta = Field(default_factory=dict)
    artifact_delta: Annotated[dict[str, int], AfterValidator(_json_safe)] = Field(default_factory=dict)
    transfer_to_agent: str | None = None
    escalate: bool | None = None
    skip_summarization: bool | None = None


class Event(_Model):
    """One turn event. ``id`` is the idempotency key (``Nats-Msg-Id``)."""

    id: EventId = Field(default_factory=new_id)
    invocation_id: str = ""
    author: str = "user"
    branch: str = ""
    message: Message | None = None
    actions: Actions = Field(default_factory=Actions)
    timestamp: Timestamp = Field(default_factory=time.time)
    metadata: JsonObject = Field(default_factory=dict)


# --- stream messages -------------------------------------------------------


class _Envelope(_Model):
    v: Literal[1] = SCHEMA_VERSION
    app: AppId
    user: UserId


class _SessionEnvelope(_Envelope):
    session: SessionId


class EventAppended(_SessionEnvelope):
    kind: Literal["event"] = "event"
    event: Event


class SessionCreated(_SessionEnvelope):
    kind: Literal["session.create"] = "session.create"
    id: EventId = Field(default_factory=new_id)
    state: StateDelta = Field(default_factory=dict)
    timestamp: Timestamp = Field(default_factory=time.time)


class SessionDeleted(_SessionEnvelope):
    kind: Literal["session.delete"] = "session.delete"
    id: EventId = Field(default_factory=new_id)
    timestamp: Timestamp = Field(default_factory=time.time)


class EventForgotten(_SessionEnvelope):
    """Forget one event of the session (the one at stream sequence ``seq``)
    everywhere: its SQL row, its index doc, cached reads and its stream
    message. Only an event of this very session is forgotten: the subject
    names the scope, so a ``seq`` of another session (or user) changes
    nothing. A checkpoint whose summary already folded the event keeps it."""

    kind: Literal["event.forget"] = "event.forget"
    id: EventId = Field(default_factory=new_id)
    seq: int = Field(ge=1, le=MAX_SQL_INT, description="stream sequence of the event to forget")
    timestamp: Timestamp = Field(default_factory=time.time)


class UserDeleted(_Envelope):
    kind: Literal["user.delete"] = "user.delete"
    id: EventId = Field(default_factory=new_id)
    timestamp: Timestamp = Field(default_factory=time.time)


SCOPE_PREFIXES = ("user:", "app:", "temp:")  # state keys that need no session
USER_PREFIX = "user:"


def user_scoped(key: str) -> str:
    """A key of a user's state (written outside any session): unprefixed
    means the user's own, ``user:<key>``; a scoped key stays as it is."""
    return key if key.startswith(SCOPE_PREFIXES) else f"{USER_PREFIX}{key}"


def user_scoped_delta(delta: dict[str, Any]) -> dict[str, Any]:
    """``delta`` with :func:`user_scoped` keys; a key given both ways
    (``lang`` and ``user:lang``) is ambiguous and refused (ValueError)."""
    scoped = {user_scoped(k): v for k, v in delta.items()}
    if len(scoped) < len(delta):
        twice = sorted(k for k in delta if not k.startswith(SCOPE_PREFIXES) and user_scoped(k) in delta)
        raise ValueError(f"keys given with and without the user: prefix: {twice[:3]}")
    return scoped


class StateSet(_Envelope):
    """A state delta outside any event, and state keys to delete. Without a
    session only ``user:`` and ``app:`` keys are allowed.

    ``delete`` removes keys (with their scope prefix, like ``delta``'s), in
    stream order like a set: a later set creates the key again, an earlier
    one never brings it back. ``null`` in ``delta`` is a value, not a delete.
    A key may not be both set and deleted by one message."""

    kind: Literal["state.set"] = "state.set"
    id: EventId = Field(default_factory=new_id)
    session: SessionId | None = None
    delta: StateDelta
    # None, not []: a message without deletes is encoded as before this field.
    delete: Annotated[list[StateKey] | None, AfterValidator(_persisted_keys)] = Field(
        default=None, description="state keys to remove"
    )
    timestamp: Timestamp = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _scoped_keys_need_a_session(self) -> StateSet:
        if self.session is None:
            bad = [k for k in [*self.delta, *(self.delete or ())] if not k.startswith(SCOPE_PREFIXES)]
            if bad:
                raise ValueError(
                    f"session-scoped keys {bad[:3]} need a session (a user's own keys take the user: prefix)"
                )
        if both := sorted(set(self.delta) & set(self.delete or ())):
            raise ValueError(f"keys {both[:3]} are both set and deleted")
        return self


class ObjectRef(_Model):
    """Where a large artifact lives: the JetStream object store."""

    bucket: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # a JetStream bucket name
    name: NoNul
    size: int = Field(ge=0, le=MAX_SQL_INT)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ArtifactSaved(_SessionEnvelope):
    """A new version of an artifact. Small content travels inline (base64);
    large content is put into the object store first and referenced."""

    kind: Literal["artifact.save"] = "artifact.save"
    id: EventId = Field(default_factory=new_id)
    filename: str = Field(min_length=1)
    mime_type: str = "application/octet-stream"
    inline: bytes | None = Field(default=None)
    object: ObjectRef | None = None
    timestamp: Timestamp = Field(default_factory=time.time)

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    @model_validator(mode="after")
    def _exactly_one_body(self) -> ArtifactSaved:
        if (self.inline is None) == (self.object is None):
            raise ValueError("an artifact needs exactly one of 'inline' or 'object'")
        if len(self.filename.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES:
            raise ValueError(f"filename must be at most {MAX_FILENAME_BYTES} bytes")
        _no_nul(self.filename)  # SQL text, and a lookup key
        return self


class CheckpointSaved(_SessionEnvelope):
    """A summary of a session's events up to ``up_to_seq`` (the summarizer's
    output). Working memory starts from the latest checkpoint and keeps every
    event after it."""

    kind: Literal["checkpoint"] = "checkpoint"
    id: EventId = Field(default_factory=new_id)
    summary: str
    up_to_seq: int = Field(ge=1, le=MAX_SQL_INT, description="stream seq of the last event folded into the summary")
    author: str = "summarizer"
    metadata: JsonObject = Field(default_factory=dict)
    timestamp: Timestamp = Field(default_factory=time.time)


StreamMessage = Annotated[
    EventAppended
    | SessionCreated
    | SessionDeleted
    | EventForgotten
    | UserDeleted
    | StateSet
    | ArtifactSaved
    | CheckpointSaved,
    Field(discriminator="kind"),
]

KINDS = (
    "event",
    "session.create",
    "session.delete",
    "event.forget",
    "user.delete",
    "state.set",
    "artifact.save",
    "checkpoint",
)
