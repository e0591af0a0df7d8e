"""What the HTTP gateway takes and answers beyond the query service's own
reply models (:mod:`memq.contracts.queries`, served as they are)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memq.contracts.queries import StoredEvent
from memq.contracts.schemas import Event, SessionId

MAX_EVENTS_PER_APPEND = 1000


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewSession(_Body):
    session: SessionId | None = Field(
        default=None, description="the session id, as the reply names it; default: a new time-ordered id"
    )
    # The first name of the field (ADK's CreateSessionRequest calls it so), kept for the clients that send it.
    session_id: SessionId | None = Field(default=None, description="the same as `session` (its older name)")
    state: dict[str, Any] = Field(
        default_factory=dict, description="initial state; keys may carry `user:`, `app:` or `temp:` prefixes"
    )

    @model_validator(mode="after")
    def _one_id(self) -> NewSession:
        if self.session is not None and self.session_id is not None and self.session != self.session_id:
            raise ValueError("`session` and `session_id` name the same field: give one")
        return self

    @property
    def id(self) -> str | None:
        return self.session if self.session is not None else self.session_id


class NewEvents(_Body):
    events: list[Event] = Field(
        min_length=1,
        max_length=MAX_EVENTS_PER_APPEND,
        description="appended in this order (an event's `id` makes a retry a no-op)",
    )
    expect_seq: int | None = Field(
        default=None,
        ge=0,
        description=(
            "append only if the session's last message is still the one at this sequence (0: none yet), "
            "else 409 `conflict`: another writer appended first. Checked on the first event"
        ),
    )
    create: bool = Field(
        default=True,
        description=(
            "true: an append to a session that does not exist (never created, or deleted) starts it. "
            "false: it is refused with 404 `not_found` and nothing is appended"
        ),
    )


class StateChange(_Body):
    set: dict[str, Any] = Field(
        default_factory=dict,
        description="keys to set (a delta); on the user's path an unprefixed key means `user:<key>`",
    )
    delete: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="keys to delete; on the user's path an unprefixed key means `user:<key>`",
    )


class SessionCreated(BaseModel):
    app: str
    user: str
    session: str
    seq: int = Field(description="stream sequence of the creation: `min_seq` of a read that must see it")


class Accepted(BaseModel):
    """A write JetStream has stored: the workers apply it in stream order."""

    seq: int = Field(description="stream sequence of the (last) message: `min_seq` of a read that must see it")


class Appended(Accepted):
    seqs: list[int] = Field(description="each event's stream sequence, in input order")


class EventsPage(BaseModel):
    """One page of a session's events, oldest first."""

    events: list[StoredEvent]
    next_cursor: str | None = Field(default=None, description="ask again with `cursor=` this for the next page")


class ErrorInfo(BaseModel):
    code: str = Field(description="stable: memq's error codes, plus `unauthenticated` and `not_allowed`")
    message: str


class ErrorBody(BaseModel):
    """Every error the gateway answers."""

    error: ErrorInfo
