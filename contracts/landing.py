"""Publishing so that a message whose ``Nats-Msg-Id`` another message took
first still lands (for publishers that may read the stream: the workers,
operators' commands).

JetStream's duplicate window is per stream, whatever the subject: a
``Nats-Msg-Id`` published first by anyone makes the stream drop every later
message with it, and answer them with a PubAck that says ``duplicate`` and
the first one's sequence. :func:`~memq.contracts.subjects.dedupe_id` puts the
subject and a digest of the bytes in the id, so a duplicate is normally this
very message, stored before (a retry, a rerun, another replica). But an id
can be predicted: an app that knows what an internal publisher will send (the
expiry sweep's delete, a replayed dead letter) can publish that id first on
its own subject. So a duplicate is not taken on trust: :func:`publish_landed`
reads the message at the acknowledged sequence and accepts it only if it is
on the same subject with the same bytes; otherwise it publishes again under a
fresh, random id (which nobody can predict) and says so in its result.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from memq.contracts.errors import PublishFailed

MSG_ID = "Nats-Msg-Id"


@dataclass(frozen=True)
class Landed:
    """Where a message is stored. ``stored_before``: JetStream had this very
    message already (the ack is its earlier copy's); ``squatted``: the id it
    was published with, which another message (at ``squatter_seq``) held, so
    it went again as ``msg_id``."""

    ack: PubAck
    msg_id: str
    stored_before: bool = False
    squatted: str | None = None
    squatter_seq: int | None = None

    @property
    def seq(self) -> int:
        return self.ack.seq


async def holds(js: JetStreamContext, stream: str, seq: int, subject: str, data: bytes) -> bool:
    """Whether the message at ``seq`` is on ``subject`` with exactly ``data``.
    A message no longer there (purged, deleted) cannot be told apart from a
    squatter's: False, and the caller publishes again."""
    try:
        raw = await js.get_msg(stream, seq=seq)
    except NotFoundError:
        return False
    return raw.subject == subject and (raw.data or b"") == data


def fresh_id(taken: str) -> str:
    """A new id for a message whose id was taken: the old one (still
    readable when debugging) and 64 random bits, which no app can predict."""
    return f"{taken}.{secrets.token_hex(8)}"


async def publish_landed(
    js: JetStreamContext,
    subject: str,
    data: bytes,
    headers: Mapping[str, str],
    stream: str | None = None,
    fresh: str | None = None,
) -> Landed:
    """Publish ``data`` on ``subject`` with ``headers`` (their ``Nats-Msg-Id``
    the dedupe id; ``stream`` the one expected to capture it) and return
    where it is stored; a duplicate ack is checked in the stream that acked it
    (:func:`holds`), and a squatted id replaced by ``fresh`` (default
    :func:`fresh_id`). Raises :class:`~memq.contracts.errors.PublishFailed` if even that comes back
    as another message's duplicate: the write did not land."""
    msg_id = headers[MSG_ID]
    ack = await js.publish(subject, data, stream=stream, headers=dict(headers))
    if not ack.duplicate:
        return Landed(ack, msg_id)
    if await holds(js, ack.stream, ack.seq, subject, data):
        return Landed(ack, msg_id, stored_before=True)
    new_id = fresh or fresh_id(msg_id)
    again = await js.publish(subject, data, stream=stream, headers={**headers, MSG_ID: new_id})
    if again.duplicate and not await holds(js, again.stream, again.seq, subject, data):
        raise PublishFailed(
            f"Nats-Msg-Id {msg_id!r} and then {new_id!r} were both held by other messages (seqs {ack.seq} "
            f"and {again.seq}): nothing was stored on {subject}"
        )
    return Landed(again, new_id, stored_before=bool(again.duplicate), squatted=msg_id, squatter_seq=ack.seq)
