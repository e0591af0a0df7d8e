"""Versioned message schemas (DESIGN §4), after Hector/ADK's event model.

Every message on ``MEMQ_EVENTS`` is one JSON object with ``v`` (schema
version) and ``kind``; :data:`StreamMessage` is the tagged union of all kinds.
State keys carry their scope as a prefix: none = session, ``user:``, ``app:``,
``temp:`` (never persisted).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, Union

import uuid_utils
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from contracts.ids import validate_id

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({SCHEMA_VERSION})
MAX_STATE_KEY_BYTES = 256
MAX_FILENAME_BYTES = 256


def new_id() -> str:
    """A time-ordered id (UUIDv7), the default for events and messages."""
    return str(uuid_utils.uuid7())


def _id(what: str):
    return AfterValidator(lambda v: validate_id(v, what))


AppId = Annotated[str, _id("app")]
UserId = Annotated[str, _id("user")]
SessionId = Annotated[str, _id("session")]
EventId = Annotated[str, _id("event id")]


def _check_state_keys(delta: dict[str, Any]) -> dict[str, Any]:
    for key in delta:
        if not key or len(key.encode("utf-8", "surrogatepass")) > MAX_STATE_KEY_BYTES:
            raise ValueError(f"state key {key[:40]!r} must be 1..{MAX_STATE_KEY_BYTES} bytes")
    return delta


StateDelta = Annotated[dict[str, Any], AfterValidator(_check_state_keys)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- message parts ---------------------------------------------------------


class TextPart(_Model):
    type: Literal["text"] = "text"
    text: str


class DataPart(_Model):
    type: Literal["data"] = "data"
    data: dict[str, Any]


class ToolCallPart(_Model):
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class ToolResultPart(_Model):
    type: Literal["tool_result"] = "tool_result"
    id: str
    name: str = ""
    result: Any = None
    is_error: bool = False


class FilePart(_Model):
    type: Literal["file"] = "file"
    uri: str
    mime_type: str = "application/octet-stream"
    name: str = ""


Part = Annotated[
    Union[TextPart, DataPart, ToolCallPart, ToolResultPart, FilePart],
    Field(discriminator="type"),
]


class Message(_Model):
    role: Literal["user", "assistant", "system", "tool"]
    parts: list[Part] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))


class Actions(_Model):
    state_delta: StateDelta = Field(default_factory=dict)
    artifact_delta: dict[str, int] = Field(default_factory=dict)
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
    timestamp: float = Field(default_factory=time.time)
    metadata: dict[str, Any] = Field(default_factory=dict)


# --- stream messages -------------------------------------------------------


class _Envelope(_Model):
    v: Literal[1] = SCHEMA_VERSION
    app: AppId
    user: UserId

    @property
    def msg_id(self) -> str:  # the Nats-Msg-Id used for JetStream dedupe
        return self.id  # type: ignore[attr-defined]


class _SessionEnvelope(_Envelope):
    session: SessionId


class EventAppended(_SessionEnvelope):
    kind: Literal["event"] = "event"
    event: Event

    @property
    def msg_id(self) -> str:
        return self.event.id


class SessionCreated(_SessionEnvelope):
    kind: Literal["session.create"] = "session.create"
    id: EventId = Field(default_factory=new_id)
    state: StateDelta = Field(default_factory=dict)
    timestamp: float = Field(default_factory=time.time)


class SessionDeleted(_SessionEnvelope):
    kind: Literal["session.delete"] = "session.delete"
    id: EventId = Field(default_factory=new_id)
    timestamp: float = Field(default_factory=time.time)


class UserDeleted(_Envelope):
    kind: Literal["user.delete"] = "user.delete"
    id: EventId = Field(default_factory=new_id)
    timestamp: float = Field(default_factory=time.time)


class StateSet(_Envelope):
    """A state delta outside any event. Without a session only ``user:`` and
    ``app:`` keys are allowed."""

    kind: Literal["state.set"] = "state.set"
    id: EventId = Field(default_factory=new_id)
    session: SessionId | None = None
    delta: StateDelta
    timestamp: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _scoped_keys_need_a_session(self) -> "StateSet":
        if self.session is None:
            bad = [k for k in self.delta if not k.startswith(("user:", "app:", "temp:"))]
            if bad:
                raise ValueError(f"session-scoped keys {bad[:3]} need a session")
        return self


class ObjectRef(_Model):
    """Where a large artifact lives: the JetStream object store."""

    bucket: str
    name: str
    size: int = Field(ge=0)
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
    timestamp: float = Field(default_factory=time.time)

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    @model_validator(mode="after")
    def _exactly_one_body(self) -> "ArtifactSaved":
        if (self.inline is None) == (self.object is None):
            raise ValueError("an artifact needs exactly one of 'inline' or 'object'")
        if len(self.filename.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES:
            raise ValueError(f"filename must be at most {MAX_FILENAME_BYTES} bytes")
        return self


class CheckpointSaved(_SessionEnvelope):
    """A summary of a session's events up to ``up_to_seq`` (the summarizer's
    output). Working memory starts from the latest checkpoint and keeps every
    event after it."""

    kind: Literal["checkpoint"] = "checkpoint"
    id: EventId = Field(default_factory=new_id)
    summary: str
    up_to_seq: int = Field(ge=1, description="stream seq of the last event folded into the summary")
    author: str = "summarizer"
    metadata: dict[str, Any] = Field(default_factory=dict)
    timestamp: float = Field(default_factory=time.time)


StreamMessage = Annotated[
    Union[EventAppended, SessionCreated, SessionDeleted, UserDeleted, StateSet, ArtifactSaved, CheckpointSaved],
    Field(discriminator="kind"),
]

KINDS = ("event", "session.create", "session.delete", "user.delete", "state.set", "artifact.save", "checkpoint")
