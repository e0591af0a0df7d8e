"""What one batch of stream messages does to SQL: pure, no I/O.

The persistence worker reads the delete tombstones of the sessions and users a
batch touches, then asks :func:`plan_commit` for the rows to write. Rules that
make any commit order of several replicas equal stream order:

- every row carries the ``seq`` of the message that wrote it;
- a state key only takes a value from a higher ``seq`` (see ``upsert_if_newer``);
- a delete at ``D`` removes rows with ``seq < D`` and leaves a tombstone, and
  writes to that scope with ``seq < D`` that arrive later are dropped here;
- ``app:`` writes survive session and user deletes, as they would in order;
- a forget at ``F`` of the session's event at ``E < F`` deletes that one row
  (by session and seq, so another session's event is never touched), drops
  it from the batch if it is there too, and moves the session's
  ``forgot_seq`` (what a cached window is compared on); it does not make a
  session visible. A forget of a seq at or after its own names no event
  that could exist before it: ignored;
- deleting a state key writes a tombstone (:data:`~memq.workers.memory.state.DELETED`)
  with the delete's ``seq``, ordered against sets by the rule above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from memq.contracts.ids import scope_key
from memq.contracts.schemas import (
    ArtifactSaved,
    CheckpointSaved,
    EventAppended,
    EventForgotten,
    SessionCreated,
    SessionDeleted,
    StateSet,
    StreamMessage,
    UserDeleted,
)
from memq.workers.memory.context import summary_message
from memq.workers.memory.state import DELETED, TOMBSTONE, split_delta, with_deletes
from memq.workers.memory.tokens import count_event, message_tokens


class UserRef(NamedTuple):
    app: str
    user: str


class SessionRef(NamedTuple):
    app: str
    user: str
    session: str
    user_key: str


class Incoming(NamedTuple):
    seq: int
    message: StreamMessage


@dataclass
class Scopes:
    """Every user and session a batch touches, by key."""

    users: dict[str, UserRef] = field(default_factory=dict)
    sessions: dict[str, SessionRef] = field(default_factory=dict)


@dataclass
class Tombstones:
    """``deleted_seq`` of users and sessions as stored (0 = never deleted)."""

    users: Mapping[str, int] = field(default_factory=dict)
    sessions: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Touch:
    """A session that gained content: it becomes visible and newer.

    ``updated_at`` is ADK's ``last_update_time``: the timestamp of the
    session's newest event in stream order (or of its creation), whatever the
    timestamps say and whatever order replicas commit in: it is stored only
    over an older ``updated_seq``. Until a session has either, the latest
    time of its other messages (state sets, artifacts, checkpoints)."""

    last_seq: int  # the newest message of any kind
    updated_at: float
    updated_seq: int = 0  # the newest event or creation (0: none in the batch)

    def add(self, seq: int, timestamp: float, *, updates: bool) -> None:
        """Take one more message at ``seq``; ``updates``: an event or the creation."""
        self.last_seq = max(self.last_seq, seq)
        if updates:
            if seq > self.updated_seq:
                self.updated_seq, self.updated_at = seq, timestamp
        elif not self.updated_seq:
            self.updated_at = max(self.updated_at, timestamp)

    @classmethod
    def first(cls, seq: int, timestamp: float, *, updates: bool) -> Touch:
        return cls(seq, timestamp, seq if updates else 0)


@dataclass
class CommitPlan:
    user_deletes: dict[str, int] = field(default_factory=dict)  # user_key -> seq
    session_deletes: dict[str, int] = field(default_factory=dict)  # session_key -> seq
    events: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    app_state: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    user_state: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    session_state: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    touched: dict[str, Touch] = field(default_factory=dict)
    # session_key -> {forgotten event seq: the forget's seq}
    forgets: dict[str, dict[int, int]] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)  # seqs whose scope was deleted after them


def keys_of(message: StreamMessage) -> tuple[str, str | None]:
    """(user_key, session_key or None) of a message."""
    user_key = scope_key(message.app, message.user)
    session = getattr(message, "session", None)
    return user_key, (scope_key(message.app, message.user, session) if session else None)


def collect_scopes(items: Iterable[Incoming]) -> Scopes:
    scopes = Scopes()
    for item in items:
        m = item.message
        user_key, session_key = keys_of(m)
        scopes.users.setdefault(user_key, UserRef(m.app, m.user))
        session: str | None = getattr(m, "session", None)
        if session_key and session:
            scopes.sessions.setdefault(session_key, SessionRef(m.app, m.user, session, user_key))
    return scopes


def _newer(target: dict, key: tuple[str, str], seq: int, value: Any) -> None:
    if key not in target or target[key][0] < seq:
        target[key] = (seq, value)


def plan_commit(
    items: Iterable[Incoming], tombstones: Tombstones, tokens: Mapping[int, int] | None = None
) -> CommitPlan:
    """The rows a batch writes. ``tokens``: each event's count by seq, where
    the caller counted them already (:func:`event_tokens`); the rest are
    counted here."""
    # Kinds are told apart with ``type(m) is``: decoded messages are of the
    # schema's own classes, and isinstance on a pydantic class goes through
    # ABCMeta, a cost per check and message here.
    items = sorted(items, key=lambda i: i.seq)
    plan = CommitPlan()

    # Deletes first: a delete later in this batch also drops earlier writes.
    for seq, m in items:
        user_key, session_key = keys_of(m)
        if type(m) is UserDeleted:
            plan.user_deletes[user_key] = max(seq, plan.user_deletes.get(user_key, 0))
        elif type(m) is SessionDeleted:
            key = scope_key(m.app, m.user, m.session)
            plan.session_deletes[key] = max(seq, plan.session_deletes.get(key, 0))

    def user_tomb(user_key: str) -> int:
        return max(tombstones.users.get(user_key, 0), plan.user_deletes.get(user_key, 0))

    def session_tomb(user_key: str, session_key: str) -> int:
        return max(
            user_tomb(user_key),
            tombstones.sessions.get(session_key, 0),
            plan.session_deletes.get(session_key, 0),
        )

    for seq, m in items:
        if type(m) in (UserDeleted, SessionDeleted):
            continue
        if type(m) is EventForgotten:
            user_key, session_key = keys_of(m)
            if session_key is not None and m.seq < seq and seq >= session_tomb(user_key, session_key):
                plan.forgets.setdefault(session_key, {})[m.seq] = seq
            continue
        user_key, session_key = keys_of(m)
        user_alive = seq >= user_tomb(user_key)
        session_alive = session_key is not None and seq >= session_tomb(user_key, session_key)

        delta: Mapping[str, Any] = {}
        if type(m) is EventAppended:
            delta = m.event.actions.state_delta
        elif type(m) is SessionCreated:
            delta = m.state
        elif type(m) is StateSet:
            delta = with_deletes(m.delta, m.delete or ())
        scoped = split_delta(delta)
        for k, v in scoped.app.items():  # app state outlives user and session deletes
            _newer(plan.app_state, (m.app, k), seq, v)
        if user_alive:
            for k, v in scoped.user.items():
                _newer(plan.user_state, (user_key, k), seq, v)

        if session_key is None:
            continue
        if not session_alive:
            plan.dropped.append(seq)
            continue
        for k, v in scoped.session.items():
            _newer(plan.session_state, (session_key, k), seq, v)

        timestamp: float
        updates = type(m) in (EventAppended, SessionCreated)  # ADK's last_update_time: see Touch
        if type(m) is EventAppended:
            plan.events.append(event_row(seq, session_key, m, tokens.get(seq) if tokens else None))
            timestamp = m.event.timestamp
        else:
            if type(m) is ArtifactSaved:
                plan.artifacts.append(_artifact_row(seq, session_key, m))
            elif type(m) is CheckpointSaved:
                plan.checkpoints.append(_checkpoint_row(seq, session_key, m))
            timestamp = m.timestamp  # type: ignore[union-attr]  # every kind but an event has its own
        touch = plan.touched.get(session_key)
        if touch is None:
            plan.touched[session_key] = Touch.first(seq, timestamp, updates=updates)
        else:
            touch.add(seq, timestamp, updates=updates)
    if plan.forgets:  # an event forgotten in its own batch is never written
        plan.events = [e for e in plan.events if e["seq"] not in plan.forgets.get(e["session_key"], ())]
        for session_key, forgotten in plan.forgets.items():
            if (touch := plan.touched.get(session_key)) is not None:  # visible: its last message is the forget
                touch.last_seq = max(touch.last_seq, *forgotten.values())
    return plan


def _text(value: str, limit: int | None = None) -> str:
    """What a free-text column keeps: PostgreSQL's text types refuse NUL, so
    it becomes U+FFFD (an event keeps its exact text in ``data``, escaped)."""
    return value.replace("\x00", "\ufffd")[:limit]


EventKey = tuple[str, str]  # (session key, event id): the events table's primary key


def event_keys(items: Iterable[Incoming]) -> dict[int, EventKey]:
    """The (session key, event id) of each event in ``items``, by seq."""
    return {
        i.seq: (scope_key(m.app, m.user, m.session), m.event.id) for i in items if type(m := i.message) is EventAppended
    }


def reused_event_ids(items: Iterable[Incoming], stored: Mapping[EventKey, tuple[int, str]]) -> dict[int, str]:
    """Events that reuse an id their session already holds with other content
    (``stored``: the events table's (seq, data) of the batch's keys, or of
    earlier events in the batch): their seq, and why. They are dead-lettered,
    never silently dropped: the client's dedupe id holds a digest of the
    content, so JetStream stores such a message, and the events table keeps
    one event per (session, id). The first in stream order stays. The same
    content again (a retry past the duplicate window, a redelivery) is no
    conflict: the insert skips it, as before."""
    seen = dict(stored)
    keys = event_keys(items)
    reused: dict[int, str] = {}
    for item in sorted(items, key=lambda i: i.seq):
        if (key := keys.get(item.seq)) is None:
            continue
        if key not in seen:
            seen[key] = (item.seq, "")  # content only read if the id comes again
            continue
        first_seq, first_data = seen[key]
        if first_seq == item.seq:
            continue
        if not first_data:  # an earlier event of this batch
            first = next(i for i in items if i.seq == first_seq).message
            first_data = event_data(first)  # type: ignore[arg-type]
            seen[key] = (first_seq, first_data)
        data = event_data(item.message)  # type: ignore[arg-type]
        if orjson.loads(data) != orjson.loads(first_data):
            reused[item.seq] = (
                f"event id {key[1]!r} is already stored in this session at seq {first_seq} with other "
                "content; the first stays. Give each new event a new id"
            )
    return reused


def event_tokens(items: Iterable[Incoming]) -> dict[int, int]:
    """What :func:`event_row` counts for each event in ``items``, by seq:
    for a caller that counts a batch of large events away from its event
    loop (counting is most of a large event's commit: ~0.9 s a MB of
    whitespace, ~0.04 s a MB of prose)."""
    return {
        i.seq: count_event(m.event.model_dump(mode="json", exclude_none=True))
        for i in items
        if type(m := i.message) is EventAppended
    }


def event_data(m: EventAppended) -> str:
    """The stored JSON of an appended event (``data`` of its row)."""
    return orjson.dumps(m.event.model_dump(mode="json", exclude_none=True)).decode()


def event_row(seq: int, session_key: str, m: EventAppended, tokens: int | None = None) -> dict[str, Any]:
    """An event's row; ``tokens`` as :func:`event_tokens` counted it, or
    counted here."""
    e = m.event
    data = e.model_dump(mode="json", exclude_none=True)
    return {
        "session_key": session_key,
        "event_id": e.id,
        "seq": seq,
        "invocation_id": _text(e.invocation_id, 256),
        "author": _text(e.author, 256),
        "branch": _text(e.branch),
        "role": e.message.role if e.message else None,
        "timestamp": e.timestamp,
        # Counted once, at commit, for the default encoding; never again per request.
        "tokens": count_event(data) if tokens is None else tokens,
        "data": orjson.dumps(data).decode(),
    }


def _artifact_row(seq: int, session_key: str, m: ArtifactSaved) -> dict[str, Any]:
    if m.inline is not None:
        size, digest, bucket, name = len(m.inline), hashlib.sha256(m.inline).hexdigest(), None, None
    elif (ref := m.object) is not None:
        size, digest, bucket, name = ref.size, ref.sha256, ref.bucket, ref.name
    else:  # the schema refuses an artifact with neither
        raise ValueError("artifact.save without inline data or an object reference")
    return {
        "session_key": session_key,
        "artifact_id": m.id,
        "filename": m.filename,
        "seq": seq,
        "mime_type": _text(m.mime_type, 255),
        "size": size,
        "sha256": digest,
        "inline": m.inline,
        "object_bucket": bucket,
        "object_name": name,
        "created_at": m.timestamp,
    }


def _checkpoint_row(seq: int, session_key: str, m: CheckpointSaved) -> dict[str, Any]:
    return {
        "session_key": session_key,
        "checkpoint_id": m.id,
        "seq": seq,
        "up_to_seq": m.up_to_seq,
        "summary": _text(m.summary),
        "tokens": message_tokens(summary_message(m.summary)),
        "author": _text(m.author, 256),
        "created_at": m.timestamp,
    }


def state_rows(writes: Mapping[tuple[str, str], tuple[int, Any]], scope_column: str) -> list[dict[str, Any]]:
    return [
        {scope_column: scope, "key": key, "value": _stored_value(value), "seq": seq}
        for (scope, key), (seq, value) in sorted(writes.items())
    ]


def _stored_value(value: Any) -> str:
    return TOMBSTONE if value is DELETED else orjson.dumps(value).decode()
