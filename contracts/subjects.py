"""The subject scheme (docs/design.md, Subjects and identity). Every subject carries the app.

- ``memq.v1.ev.<app>.<user>.<session>``  session-scoped messages (events,
  session create/delete, state, artifacts), captured by ``MEMQ_EVENTS``
- ``memq.v1.ev.<app>.<user>``            user-scoped messages (delete user,
  user/app state), captured by ``MEMQ_EVENTS``
- ``memq.v1.changed.<app>.<user>.<session>``  core NATS notice after a commit
- ``memq.v1.committed.<durable>[.<stream>]``  core NATS: the stream sequences a
  replica finished with in one batch (read-your-writes); ``.<stream>`` for an
  app's own stream (``MEMQ_EVENTS_<app>``), none for the shared one
- ``memq.v1.q.<app>.<op>``               requests (core NATS, in no stream)
- ``memq.v1.dlq.<worker>``               dead letters, captured by ``MEMQ_DLQ``
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from memq.contracts.errors import InvalidId
from memq.contracts.ids import decode_token, encode_token, scope_key

PREFIX = "memq.v1"
EVENTS_STREAM = "MEMQ_EVENTS"
DLQ_STREAM = "MEMQ_DLQ"
ARTIFACT_BUCKET = "MEMQ_ARTIFACTS"

EVENTS_WILDCARD = f"{PREFIX}.ev.>"
DLQ_WILDCARD = f"{PREFIX}.dlq.>"
CHANGED_WILDCARD = f"{PREFIX}.changed.>"


class Scope(NamedTuple):
    app: str
    user: str
    session: str | None = None


def events_subject(app: str, user: str, session: str | None = None) -> str:
    base = f"{PREFIX}.ev.{encode_token(app, 'app')}.{encode_token(user, 'user')}"
    return base if session is None else f"{base}.{encode_token(session, 'session')}"


def dedupe_id(subject: str, id: str, data: bytes | None = None) -> str:
    """The ``Nats-Msg-Id`` of a message with ``id`` published on ``subject``:
    ``<sha256(subject)[:32]>.<id as a token>[.<sha256(data)[:16]>]``.

    JetStream's duplicate window is per stream, not per subject, so a bare id
    would let one app (or one session) make the stream drop another's message.
    The subject (app, user, session) is in the id, as a digest so the header
    stays bounded whatever the ids' lengths (it is the message's own subject,
    so it can be recomputed when debugging). With ``data`` (the payload as
    published: every client write), a duplicate is an identical message only,
    so a duplicate ack always means the caller's own retry; the same id with
    other content is stored, and the persistence worker dead-letters it
    (``duplicate_id``). Without ``data`` (internal publishers whose reruns make
    the same id with another timestamp: the session-expiry sweep, DLQ replays),
    the id alone dedupes. The parts are joined by ``.``, which no token holds."""
    scope = hashlib.sha256(subject.encode()).hexdigest()[:32]
    base = f"{scope}.{encode_token(id, 'id')}"
    return base if data is None else f"{base}.{hashlib.sha256(data).hexdigest()[:16]}"


def user_events_filter(app: str, user: str) -> list[str]:
    """Every stream subject that holds data of one user (for purges)."""
    base = events_subject(app, user)
    return [base, f"{base}.>"]


def parse_events_subject(subject: str) -> Scope:
    """Decode ``memq.v1.ev.<app>.<user>[.<session>]``; raise InvalidId if malformed."""
    parts = subject.split(".")
    if parts[:3] != ["memq", "v1", "ev"] or len(parts) not in (5, 6):
        raise InvalidId(f"{subject!r} is not a memq event subject")
    app = decode_token(parts[3], "app")
    user = decode_token(parts[4], "user")
    session = decode_token(parts[5], "session") if len(parts) == 6 else None
    return Scope(app, user, session)


def changed_subject(app: str, user: str, session: str | None = None) -> str:
    base = f"{PREFIX}.changed.{encode_token(app, 'app')}.{encode_token(user, 'user')}"
    return base if session is None else f"{base}.{encode_token(session, 'session')}"


def committed_subject(durable: str, stream: str | None = None) -> str:
    """Where the replicas sharing the durable consumer ``durable`` (of
    ``stream``; None: the shared events stream) say which stream sequences
    they have finished with (:class:`memq.contracts.notices.CommittedRanges`).
    Sequences are per stream, so each stream has a subject of its own."""
    return f"{PREFIX}.committed.{durable}" if stream is None else f"{PREFIX}.committed.{durable}.{stream}"


# A stream name's limit is the server's directory name (255 bytes); a long
# app token is replaced by its digest there.
_MAX_STREAM_TOKEN = 64


def app_events_stream(app: str) -> str:
    """The name of ``app``'s own events stream, where a deployment gives each
    app one (``streams.apps``): ``MEMQ_EVENTS_<app as a token>``, or the
    token's digest for a long id."""
    token = encode_token(app, "app")
    if len(token) > _MAX_STREAM_TOKEN:
        token = "h" + hashlib.sha256(token.encode()).hexdigest()[:40]
    return f"{EVENTS_STREAM}_{token}"


def app_events_wildcard(app: str) -> str:
    """Every events subject of ``app``: what its own stream captures."""
    return f"{PREFIX}.ev.{encode_token(app, 'app')}.>"


def status_subject(app: str, user: str, session: str) -> str:
    """Where workers announce what they do to a session (``{"state": "summarizing"}``):
    core NATS, in no stream, so a client shows it while it happens."""
    return f"{PREFIX}.status.{encode_token(app, 'app')}.{encode_token(user, 'user')}.{encode_token(session, 'session')}"


def request_subject(app: str, op: str) -> str:
    return f"{PREFIX}.q.{encode_token(app, 'app')}.{op}"


def dlq_subject(worker: str) -> str:
    return f"{PREFIX}.dlq.{worker}"


def artifact_object_name(app: str, user: str, session: str, artifact_id: str) -> str:
    """Object-store name of a large artifact, prefixed by the user and session
    keys so that deletes find every object of a session or user without SQL."""
    return f"{scope_key(app, user)}/{scope_key(app, user, session)}/{artifact_id}"
