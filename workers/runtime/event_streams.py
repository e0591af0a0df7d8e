"""Which events stream holds an app's messages, and what each stream is.

By default every app shares one stream (``streams.events``, ``MEMQ_EVENTS``).
A multi-tenant deployment lists its apps in ``streams.apps``, and each listed
app gets a stream of its own, ``MEMQ_EVENTS_<app>``, capturing only its
subjects. JetStream's limits, duplicate window, sequences and expectation
headers are all per stream, so an app's stream gives it:

- a quota (``max_bytes``, discard new): a full app is refused, the others go on;
- a duplicate window of its own: no ``Nats-Msg-Id`` of one app can drop
  another's message;
- sequences, and ``Nats-Expected-Last-*`` headers, that count and see only
  its own messages: nothing about another app can be learnt from a PubAck or
  a refusal.

Sequences are per stream: every floor (commit, index), tail and consumer
exists once per stream, and a read waits on its own app's stream alone.

With any app listed, the shared stream captures nothing new (its subjects
are retired) but stays: its history is replayed and consumed as before. An
app's stream is created starting after the shared stream's last sequence, so
a session moved from the shared stream keeps its order.
"""

from __future__ import annotations

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from memq.contracts.subjects import (
    EVENTS_WILDCARD,
    PREFIX,
    app_events_stream,
    app_events_wildcard,
    committed_subject,
    parse_events_subject,
)
from memq.workers.settings import StreamSettings

DAY = 86_400.0

# What the shared stream captures once apps have streams of their own: a
# subject nothing publishes on (an app's events would overlap its stream's).
RETIRED_SUBJECT = f"{PREFIX}.retired.events"

APP_METADATA = "memq.app"  # an app stream's app, in its metadata


def per_app(s: StreamSettings) -> bool:
    return bool(s.apps)


def stream_of(s: StreamSettings, app: str) -> str:
    """The stream that holds ``app``'s messages."""
    return app_events_stream(app) if app in s.apps else s.events


def stream_of_subject(s: StreamSettings, subject: str) -> str:
    """The stream that captures an events subject."""
    return stream_of(s, parse_events_subject(subject).app)


def event_streams(s: StreamSettings) -> list[str]:
    """Every events stream a worker kind consumes: the shared one first
    (always there; in per-app mode it holds only what was written before),
    then each app's."""
    return [s.events, *(app_events_stream(app) for app in sorted(s.apps))]


def notice_subject(s: StreamSettings, durable: str, stream: str) -> str:
    """Where the replicas of ``durable`` on ``stream`` announce what they
    finished (the shared stream keeps the subject it always had)."""
    return committed_subject(durable, None if stream == s.events else stream)


def quota(s: StreamSettings, app: str) -> int:
    """``app``'s stream quota in bytes (-1: unlimited)."""
    own = s.apps[app].max_bytes if app in s.apps else None
    return s.app_max_bytes if own is None else own


def shared_stream_config(s: StreamSettings) -> StreamConfig:
    return StreamConfig(
        name=s.events,
        description="memq: every message of every session, in order (the log)"
        if not per_app(s)
        else "memq: the messages written before apps had streams of their own (replayed, never written)",
        subjects=[RETIRED_SUBJECT if per_app(s) else EVENTS_WILDCARD],
        retention=RetentionPolicy.LIMITS,  # replay needs the log kept after acks
        discard=DiscardPolicy.OLD,
        max_age=s.max_age_days * DAY,
        max_bytes=s.max_bytes,
        max_msg_size=s.max_message_bytes * 2,  # oversize ones still reach the DLQ
        storage=StorageType(s.storage),
        num_replicas=s.replicas,
        duplicate_window=s.duplicate_window_s,
    )


def app_stream_config(s: StreamSettings, app: str, first_seq: int = 1) -> StreamConfig:
    """``app``'s own stream. Discard new: a full app is refused its next
    write (and told its quota) rather than losing its oldest messages."""
    return StreamConfig(
        name=app_events_stream(app),
        description=f"memq: every message of app {app!r}, in order (its log)",
        subjects=[app_events_wildcard(app)],
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.NEW,
        max_age=s.max_age_days * DAY,
        max_bytes=quota(s, app),
        max_msg_size=s.max_message_bytes * 2,
        storage=StorageType(s.storage),
        num_replicas=s.replicas,
        duplicate_window=s.duplicate_window_s,
        first_seq=first_seq,
        metadata={APP_METADATA: app},
    )
