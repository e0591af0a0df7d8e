"""The dead-letter protocol: what a message in ``MEMQ_DLQ`` carries.

A worker that gives up on a message (it can never be processed: bad input, a
row the database refuses) publishes the body unchanged on
``memq.v1.dlq.<worker>`` (``memq.contracts.subjects.dlq_subject``) with
these headers, and goes on:

- ``Memq-Worker``: the worker kind that gave up (``persistence``, ...).
- ``Memq-Error-Code``: a code from :mod:`memq.contracts.errors`, or a
  worker's own (``storage_rejected``; ``duplicate_id``: an event id its
  session already holds with other content).
- ``Memq-Error``: why, one line of ASCII, at most ``MAX_REASON`` (2000) characters.
- ``Memq-Original-Subject`` and ``Memq-Original-Seq``: where the message was
  in ``MEMQ_EVENTS``; a replay publishes it on that subject again.
- ``Nats-Msg-Id``: ``<worker>:<stream>:<seq>``, so a worker that dead-letters
  the same message twice (redelivered before its ack) stores it once.

A replayed message carries ``Memq-Replayed-From: <DLQ seq>`` and the msg id
``dedupe_id(<original subject>, "memq-replay:<DLQ stream>:<DLQ seq>", <body>)``:
the digest of the body makes a rerun of the same replay one message, and the
replay checks a duplicate ack against the stream
(:func:`memq.contracts.landing.publish_landed`): the DLQ's sequences are small
and predictable, so an app can publish such an id first on its own subject.

Writers (the workers) and readers (``memq dlq``, operators' own tools) build
and read the headers only through this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memq.contracts.subjects import dedupe_id

MSG_ID = "Nats-Msg-Id"
WORKER = "Memq-Worker"
ERROR_CODE = "Memq-Error-Code"
ERROR = "Memq-Error"
ORIGINAL_SUBJECT = "Memq-Original-Subject"
ORIGINAL_SEQ = "Memq-Original-Seq"
REPLAYED_FROM = "Memq-Replayed-From"

REPLAY_ID_PREFIX = "memq-replay"
# The persistence worker's code for an event whose session already holds its id
# with other content (the first stays): not a contract error, as nothing raises it.
DUPLICATE_ID = "duplicate_id"
MAX_REASON = 2000  # characters of Memq-Error; the body stays as it was


def one_line(reason: str) -> str:
    """``reason`` as one line of ASCII, cut to ``MAX_REASON`` characters.

    Reasons quote the input: CR/LF would forge header and log lines, and
    non-ASCII header values come back from nats-py's ``get_msg`` as
    ``email.header.Header``, not ``str``.
    """
    cut = reason[:MAX_REASON].replace("\r", " ").replace("\n", " ")
    return cut.encode("ascii", "backslashreplace").decode()


@dataclass(frozen=True)
class DeadLetterHeaders:
    """Why a message was dead-lettered and where it came from."""

    worker: str
    code: str
    reason: str
    original_subject: str
    original_seq: int | None

    def to_headers(self, original_stream: str) -> dict[str, str]:
        """The NATS headers to publish the dead letter with (``reason`` made
        one line here, whatever the caller passed)."""
        seq = "" if self.original_seq is None else str(self.original_seq)
        return {
            MSG_ID: f"{self.worker}:{original_stream}:{seq}",
            WORKER: self.worker,
            ERROR_CODE: self.code,
            ERROR: one_line(self.reason),
            ORIGINAL_SUBJECT: self.original_subject,
            ORIGINAL_SEQ: seq,
        }

    @classmethod
    def from_headers(cls, headers: Mapping[str, str] | None, subject: str) -> DeadLetterHeaders:
        """Read them back from a message on ``subject`` in ``MEMQ_DLQ``.

        Lenient, for letters written by older or foreign tools: a missing
        ``Memq-Worker`` is taken from the subject's last token, other missing
        headers read as empty, and a ``Memq-Original-Seq`` that is not a
        number as None.
        """
        h = headers or {}
        seq = h.get(ORIGINAL_SEQ)
        return cls(
            worker=h.get(WORKER) or subject.rsplit(".", 1)[-1],
            code=h.get(ERROR_CODE, ""),
            reason=h.get(ERROR, ""),
            original_subject=h.get(ORIGINAL_SUBJECT, ""),
            original_seq=int(seq) if seq and seq.isdigit() else None,
        )


def replay_headers(dlq_stream: str, dlq_seq: int, subject: str, data: bytes) -> dict[str, str]:
    """Headers of a replayed message, ``data`` published on ``subject``:
    running the same replay twice within the duplicate window (a crash between
    publish and delete) appends it once. The id holds the subject and a digest
    of ``data`` (:func:`~memq.contracts.subjects.dedupe_id`), but it is
    predictable: the replay still checks what a duplicate ack points at."""
    replay_id = f"{REPLAY_ID_PREFIX}:{dlq_stream}:{dlq_seq}"
    return {MSG_ID: dedupe_id(subject, replay_id, data), REPLAYED_FROM: str(dlq_seq)}
