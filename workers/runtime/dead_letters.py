"""Dead letters: sending them (:class:`DeadLetters`, used by the workers) and
`memq dlq list|replay`, to inspect them and send them back once fixed.

A dead letter is the original message body in ``MEMQ_DLQ`` with headers that
say which worker gave up on it, why and where it came from; the protocol, and
the only code that writes or reads those headers, is
:mod:`memq.contracts.dlq`.

Replaying publishes the body again on its original subject, so every worker
kind sees it anew, and deletes the dead letter only once that publish is
stored on that subject: a duplicate ack is read back
(:func:`memq.contracts.landing.publish_landed`), since an app can publish the
replay's id first on its own subject, and a replay whose id was taken goes
again under a fresh one. Effects are keyed by
event id, so a message that did commit elsewhere is not doubled. The replayed
copy takes a new place at the end of the log: a replayed state change wins
over changes made to the same key since (it is applied as of now).

Messages are read one by one with the direct ``get_msg(next=True)`` API
rather than a consumer: listing must not leave consumers behind or move
anything, and the DLQ is small by nature.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from memq.contracts.dlq import ERROR, ORIGINAL_SUBJECT, DeadLetterHeaders, replay_headers
from memq.contracts.errors import InvalidId, PublishFailed
from memq.contracts.landing import publish_landed
from memq.contracts.subjects import DLQ_WILDCARD, PREFIX, dlq_subject
from memq.workers import metrics
from memq.workers.runtime.event_streams import stream_of_subject
from memq.workers.settings import StreamSettings

log = logging.getLogger("memq.dlq")


class DeadLetters:
    """Publishes a message no worker can process to ``MEMQ_DLQ``, with the reason."""

    def __init__(self, js: JetStreamContext, worker: str):
        self.js = js
        self.subject = dlq_subject(worker)
        self.worker = worker
        self.log = logging.getLogger(f"memq.{worker}")  # logged as the worker that gave up

    async def send(self, msg: Msg, code: str, reason: str) -> None:
        meta = msg.metadata
        await self.send_data(msg.data, code, reason, msg.subject, meta.stream, meta.sequence.stream)

    async def send_data(self, data: bytes, code: str, reason: str, subject: str, stream: str, seq: int | None) -> None:
        """Dead-letter ``data``, which came from ``seq`` on ``subject`` in
        ``stream`` (or was made from it: the fact worker's LLM reply)."""
        letter = DeadLetterHeaders(self.worker, code, reason, subject, seq)
        headers = letter.to_headers(stream)
        # The DLQ is the workers' own (no app may publish there), but a
        # duplicate is still read back: one message for each dead-lettering.
        where = await publish_landed(self.js, self.subject, data, headers)
        if where.squatted is not None:
            metrics.SQUATTED_IDS.labels("dead-letters").inc()
            self.log.warning(
                "dead letter id %s was taken (seq %s): sent as %s", where.squatted, where.squatter_seq, where.msg_id
            )
        metrics.DEAD_LETTERED.labels(self.worker, code).inc()
        self.log.warning("dead-lettered seq %s: %s: %s", seq, code, headers[ERROR])


@dataclass
class DeadLetter:
    seq: int  # in the DLQ stream
    time: datetime | None
    worker: str
    code: str
    reason: str
    original_subject: str
    original_seq: int | None
    size: int
    data: bytes

    def to_dict(self, preview: int = 200) -> dict[str, Any]:
        out = asdict(self)
        out["time"] = self.time.isoformat() if isinstance(self.time, datetime) else self.time
        out["data"] = self.data[:preview].decode("utf-8", "replace")
        return out


@dataclass
class ReplayResult:
    replayed: list[int]  # DLQ seqs sent back (and deleted unless kept)
    skipped: list[tuple[int, str]]  # DLQ seq, why (kept in the DLQ)
    # DLQ seqs whose replay id another message held: sent again under a fresh id
    squatted: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class DeadLetterFilter:
    worker: str | None = None
    code: str | None = None
    seqs: frozenset[int] | None = None  # None: any

    def subject(self) -> str:
        return dlq_subject(self.worker) if self.worker else DLQ_WILDCARD

    def matches(self, letter: DeadLetter) -> bool:
        return (self.code is None or letter.code == self.code) and (self.seqs is None or letter.seq in self.seqs)


def _to_letter(raw: RawStreamMsg) -> DeadLetter:
    # get_msg fills both for every stored message; None is only the fields' default
    if raw.seq is None or raw.subject is None:
        raise ValueError(f"a stored message without its sequence or subject: {raw!r}")
    why = DeadLetterHeaders.from_headers(raw.headers, raw.subject)
    return DeadLetter(
        seq=raw.seq,
        time=raw.time,
        worker=why.worker,
        code=why.code,
        reason=why.reason,
        original_subject=why.original_subject,
        original_seq=why.original_seq,
        size=len(raw.data or b""),
        data=raw.data or b"",
    )


async def iter_dead_letters(js: JetStreamContext, stream: str, where: DeadLetterFilter = DeadLetterFilter()):
    """Yield the dead letters that match ``where``, oldest first."""
    seq = 1
    subject = where.subject()
    while True:
        try:
            raw = await js.get_msg(stream, seq=seq, next=True, subject=subject)
        except NotFoundError:  # past the last one (or no stream)
            return
        letter = _to_letter(raw)
        if where.matches(letter):
            yield letter
        seq = letter.seq + 1


async def list_dead_letters(
    js: JetStreamContext, stream: str, where: DeadLetterFilter = DeadLetterFilter(), limit: int | None = None
) -> list[DeadLetter]:
    out: list[DeadLetter] = []
    async for letter in iter_dead_letters(js, stream, where):
        out.append(letter)
        if limit is not None and len(out) >= limit:
            break
    return out


def _replayable(letter: DeadLetter, events_prefix: str) -> str | None:
    """Why ``letter`` cannot be replayed, or None."""
    if not letter.original_subject:
        return f"no {ORIGINAL_SUBJECT} header"
    if not letter.original_subject.startswith(events_prefix):
        return f"original subject {letter.original_subject!r} is not an event subject"
    return None


async def replay_dead_letters(
    js: JetStreamContext,
    dlq_stream: str,
    streams: StreamSettings,
    where: DeadLetterFilter,
    keep: bool = False,
    on_replayed: Callable[[DeadLetter], None] | None = None,
) -> ReplayResult:
    """Publish each matching dead letter on its original subject, then, once
    it is stored there (in its app's events stream), delete it from the DLQ
    (unless ``keep``).

    The publish carries ``Nats-Msg-Id: dedupe_id(subject, memq-replay:<dlq
    seq>, body)``: running the same replay twice within the duplicate window
    (e.g. after a crash between publish and delete) appends it once. A
    duplicate ack that is not this message on this subject (an app published
    the id first on its own subject) does not count: the letter goes again
    under a fresh id (``squatted``), and one that cannot be stored stays in
    the DLQ (``skipped``).
    """
    result = ReplayResult([], [])
    letters = [letter async for letter in iter_dead_letters(js, dlq_stream, where)]
    for letter in letters:
        why = _replayable(letter, f"{PREFIX}.ev.")
        if why:
            result.skipped.append((letter.seq, why))
            continue
        subject = letter.original_subject
        headers = replay_headers(dlq_stream, letter.seq, subject, letter.data)
        try:
            stream = stream_of_subject(streams, subject)
            landed = await publish_landed(js, subject, letter.data, headers, stream)
        except (PublishFailed, InvalidId) as exc:
            result.skipped.append((letter.seq, str(exc)))
            continue
        if landed.squatted is not None:
            result.squatted.append(letter.seq)
            metrics.SQUATTED_IDS.labels("dlq-replay").inc()
            log.warning(
                "replay of dead letter %d: its id was taken by seq %s, not on %s; sent again as %s at seq %d",
                letter.seq,
                landed.squatter_seq,
                subject,
                landed.msg_id,
                landed.seq,
            )
        if not keep:
            await js.delete_msg(dlq_stream, letter.seq)
        result.replayed.append(letter.seq)
        if on_replayed:
            on_replayed(letter)
    return result


def summarize(letters: list[DeadLetter]) -> Iterator[tuple[str, str, int]]:
    """(worker, code, count) per kind of failure, most frequent first."""
    counts: dict[tuple[str, str], int] = {}
    for letter in letters:
        counts[(letter.worker, letter.code)] = counts.get((letter.worker, letter.code), 0) + 1
    for (worker, code), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        yield worker, code, n
