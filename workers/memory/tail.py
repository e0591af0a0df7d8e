"""What a session's uncommitted messages add to its events: pure, no I/O.

A read with ``min_seq`` above the commit floor need not wait for the commit
when all that lies between the floor and ``min_seq`` on the session's
subject only appends events: the query worker holds those messages as the
stream delivers them (:mod:`memq.workers.query.stream_tail`) and adds the events to
what SQL holds, exactly as the persistence worker will write them. Anything else
that changes which events a read sees (a delete, a new session, a
checkpoint, a forgotten event) makes the read wait for the commit instead, as every read did
before. A session SQL does not show yet (never held, or deleted at or
below the floor) begins in the tail: everything up to the floor is in SQL.

The persistence rules this applies (:mod:`memq.workers.memory.commit_plan`):

- a message that does not decode is dead-lettered, never written: skipped;
- an event below the session's tombstone is dropped: the caller filters by
  the tombstone it read from SQL (:func:`memq.workers.sql.window.with_tail`),
  since a delete inside the tail never gets this far;
- an event id is the idempotency key within a session: a second event with
  an id already written, or already earlier in the tail, is not written;
- state writes and artifacts do not change the events: they are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from memq.contracts.queries import Carried
from memq.contracts.schemas import (
    ArtifactSaved,
    CheckpointSaved,
    EventAppended,
    EventForgotten,
    SessionCreated,
    SessionDeleted,
    StateSet,
    UserDeleted,
)
from memq.workers.memory.commit_plan import Incoming, event_row

# Kinds that change what a read of the session's events sees, other than appends.
_REWRITES = (SessionCreated, SessionDeleted, EventForgotten, UserDeleted, CheckpointSaved)


class MustWait(Exception):
    """The uncommitted tail cannot be applied without the commit's rules
    that need SQL (a delete, a new session, a checkpoint...): the read waits
    for the commit instead. The message says why (for logs and tests)."""


# What a carried write may be besides an event, and still leave the events as they are.
_LEAVES_EVENTS = {StateSet.model_fields["kind"].default, ArtifactSaved.model_fields["kind"].default}


def carried_events(
    carried: Carried, floor: int, upto: int, app: str, user: str, session: str, session_key: str
) -> list[dict[str, Any]]:
    """The event rows that the caller's carried writes (``queries.Carried``,
    see :mod:`memq.contracts.carry`) add to SQL as of the commit ``floor``,
    up to ``upto``. Exact only for the caller's own writes, which is what a
    read without ``consistency="any"`` promises. Raise :class:`MustWait` when
    the caller has writes above the floor that are not carried, or that do
    more than append."""
    if carried.after > floor:
        raise MustWait(f"the caller's writes up to seq {carried.after} are not carried")
    if carried.user_seq > floor:
        raise MustWait(f"the caller wrote to the user at seq {carried.user_seq}")
    items: list[Incoming] = []
    for write in sorted(carried.writes, key=lambda w: w.seq):
        if write.seq <= floor or write.seq > upto:
            continue
        if write.kind in _LEAVES_EVENTS:
            continue
        if write.kind != "event" or write.event is None:
            raise MustWait(f"seq {write.seq} is a {write.kind} message")
        # Built unvalidated: the event was validated with the request.
        message = EventAppended.model_construct(app=app, user=user, session=session, event=write.event)
        items.append(Incoming(write.seq, message))
    return tail_events(items, session_key)


def tail_events(items: Iterable[Incoming], session_key: str) -> list[dict[str, Any]]:
    """The event rows (as :func:`memq.workers.memory.commit_plan.event_row`
    makes them, ``data`` decoded) that these messages, the session's in
    stream order, append; the first of each event id only. Raise
    :class:`MustWait` for a message that does more than append."""
    rows: list[dict[str, Any]] = []
    ids: set[str] = set()
    for seq, message in items:
        if isinstance(message, _REWRITES):
            raise MustWait(f"seq {seq} is a {message.kind} message")
        if not isinstance(message, EventAppended) or message.event.id in ids:
            continue
        ids.add(message.event.id)
        row = event_row(seq, session_key, message)
        # What a read of the stored row decodes: the same JSON, parsed back.
        row["data"] = orjson.loads(row["data"])
        rows.append(row)
    return rows
