"""Replies of any size, in pages that each fit one NATS message.

``session.get``, ``history`` and ``context`` may answer more events than the
server's ``max_payload`` carries. They answer in pages bounded by bytes (the
worker's reply budget, :attr:`memq.workers.query.ops.OpContext.reply_bytes`)
and hand back a cursor for the rest.

A read's pages are consistent: the first page fixes a snapshot, the newest
sequence it saw, and every later page reads only events in (the last seq
returned, snapshot]. Events appended between pages neither shift nor repeat
what the read returns. The cursor is opaque to callers but not secret: it
only holds sequences and a fingerprint of the request it continues. A
cursor passed with another request (another session, user, app or filter) is
refused, and every page reads only the session its request names, so a
forged cursor reaches nothing the request could not.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import orjson
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts import queries as q
from memq.contracts.errors import InvalidRequest
from memq.contracts.replies import ok_body
from memq.workers.sql import reads

T = TypeVar("T")

CURSOR_VERSION = 1
# Room under max_payload for what a page's byte count does not see: the
# cursor (under 100 bytes) and JSON that pydantic writes a little differently
# from orjson, which sizes the events.
REPLY_MARGIN = 4096
MIN_REPLY_BYTES = 1024  # a server with a smaller max_payload still gets pages this big
_NOT_IN_FINGERPRINT = {"cursor", *q.NOT_WHAT_IS_ASKED}


def reply_bytes(max_payload: int) -> int:
    """The byte budget of one reply on a connection with this ``max_payload``."""
    return max(max_payload - REPLY_MARGIN, MIN_REPLY_BYTES)


@dataclass(frozen=True)
class Cursor:
    """Where the next page of a read starts.

    :param snapshot: the newest seq the first page saw; no page reads past it.
    :param after: the last seq returned so far; the next page starts after it.
    """

    snapshot: int
    after: int


def _fingerprint(op: str, req: BaseModel) -> str:
    fields = req.model_dump(mode="json", exclude=_NOT_IN_FINGERPRINT, exclude_none=True)
    return hashlib.sha256(orjson.dumps([op, fields], option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def encode(op: str, req: BaseModel, cursor: Cursor) -> str:
    """The ``next_cursor`` that continues ``req`` (an ``op`` request) at ``cursor``."""
    raw = orjson.dumps([CURSOR_VERSION, _fingerprint(op, req), cursor.snapshot, cursor.after])
    return base64.urlsafe_b64encode(raw).decode()


def decode(op: str, req: BaseModel) -> Cursor | None:
    """The cursor ``req`` carries (None on a first page). Raises
    :class:`~memq.contracts.errors.InvalidRequest` for one this module did
    not make for this very request."""
    text = getattr(req, "cursor", None)
    if text is None:
        return None
    try:
        version, fingerprint, snapshot, after = orjson.loads(base64.urlsafe_b64decode(text.encode()))
    except Exception:
        raise InvalidRequest(f"{op}: malformed cursor; pass back the next_cursor of a previous page") from None
    if (
        version != CURSOR_VERSION
        or not isinstance(fingerprint, str)
        or not all(type(n) is int for n in (snapshot, after))
        or not 0 <= after <= snapshot
    ):
        raise InvalidRequest(f"{op}: malformed cursor; pass back the next_cursor of a previous page")
    if fingerprint != _fingerprint(op, req):
        raise InvalidRequest(
            f"{op}: the cursor belongs to another request; page with the request that returned it "
            "(same app, user, session and parameters)"
        )
    return Cursor(snapshot, after)


def body_size(reply: BaseModel) -> int:
    """Bytes of ``reply`` on the wire, as the query worker sends it."""
    return len(ok_body(reply))


def json_size(value: object) -> int:
    """Bytes ``value`` adds to a JSON list, its comma included."""
    return len(orjson.dumps(value)) + 1


def fill(rendered: Iterable[tuple[T, int]], room: int, *, at_least_one: bool) -> tuple[list[T], int, bool]:
    """``(item, bytes)`` pairs, in order, while they fit ``room`` bytes; read
    only as far as needed. Returns the items taken, their bytes, and whether
    one was left out. ``at_least_one``: take one even if it alone is too big,
    so that every continuation page makes progress (the worker then refuses a
    reply over max_payload as ``oversize``)."""
    taken: list[T] = []
    used = 0
    for item, size in rendered:
        if used + size > room and (taken or not at_least_one):
            return taken, used, True
        taken.append(item)
        used += size
    return taken, used, False


CHUNK = 512  # events read per round trip while a page fills


async def event_run(
    conn: AsyncConnection,
    session_key: str,
    cursor: Cursor,
    room: int,
    render: Callable[[reads.StoredEvent], tuple[T, int]],
    *,
    only: reads.EventFilter = reads.NO_FILTER,
    first: bool = False,
) -> tuple[list[T], int, Cursor | None]:
    """The session's events in (cursor.after, cursor.snapshot] that pass
    ``only``, oldest first and rendered, as many as fit ``room`` bytes (at
    least one unless ``first``: a first page may be filled by what comes
    before the events). Returns them, their bytes, and the cursor of the
    next page (None when this one holds the last event)."""
    taken: list[T] = []
    used, after = 0, cursor.after
    while True:
        chunk = await reads.events_after(conn, session_key, after, CHUNK, up_to_seq=cursor.snapshot, only=only)
        got, size, full = fill(map(render, chunk), room - used, at_least_one=not (first or taken))
        taken += got
        used += size
        after = chunk[len(got) - 1].seq if got else after
        if full:
            return taken, used, Cursor(cursor.snapshot, after)
        if len(chunk) < CHUNK:
            return taken, used, None
