"""Reads that see every writer (``consistency="any"``): the newest sequence
any client had acknowledged in a read's scope, from JetStream itself.

A read's ``min_seq`` covers the caller's own writes only. Two agent
processes on one session (two ADK Runner replicas, the HTTP gateway beside
a Python client) each need the other's acknowledged writes too. A publish is
acknowledged once the stream holds it, so the stream's last message on the
read's subjects is the newest write the read must see: one lookup
(``STREAM.MSG.GET`` with ``last_by_subj``, which takes a wildcard), then the
usual wait for the commit floor to pass it.

The scope is the user's subjects (``memq.v1.ev.<app>.<user>`` and every
session under it): a session's own events, and the ``user:`` state and user
deletes that its merged state and existence depend on. An app-wide listing
takes the app's subjects. ``app:`` state written under another user is not
waited for.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from memq.contracts import queries as q
from memq.contracts.ids import encode_token
from memq.contracts.subjects import PREFIX, user_events_filter


def read_scope(req: q.Request) -> list[str]:
    """The stream subjects whose writes a read with ``consistency="any"`` must see."""
    user = getattr(req, "user", None)
    if user is None:  # sessions.list of the whole app
        return [f"{PREFIX}.ev.{encode_token(req.app, 'app')}.>"]
    return user_events_filter(req.app, user)


async def last_acknowledged(js: JetStreamContext, stream: str, subjects: list[str]) -> int:
    """The stream sequence of the newest message on any of ``subjects`` (0: none)."""
    seqs = await asyncio.gather(*(_last(js, stream, subject) for subject in subjects))
    return max(seqs, default=0)


async def _last(js: JetStreamContext, stream: str, subject: str) -> int:
    try:
        msg = await js.get_last_msg(stream, subject)
    except NotFoundError:  # nothing written there (or all of it deleted)
        return 0
    return msg.seq or 0
