"""Settling a publish: how :class:`~memq.contracts.client.MemoryClient`
gets each message it publishes acknowledged by JetStream, exactly once.

A publish whose outcome is unknown (no PubAck within the try's wait, the
connection lost while nats-py reconnects) may have been stored, so it is
published again, same ``Nats-Msg-Id``, backing off
(:mod:`memq.contracts.backoff`) and waiting longer for each try's acks,
until JetStream acknowledges it (a duplicate's ack carries the original
sequence) or ``publish_deadline`` has passed; then
:class:`~memq.contracts.errors.PublishOutcomeUnknown`. A publish that failed
for now (disconnected with nats-py's buffer full, JetStream temporarily
unavailable, no stream answering during a failover) is tried again the same
way; a definite refusal becomes its typed error at once
(:class:`~memq.contracts.errors.Conflict` for a refused ``expect_seq``,
:class:`~memq.contracts.errors.Forbidden`,
:class:`~memq.contracts.errors.Oversize`,
:class:`~memq.contracts.errors.PublishFailed`).

:class:`PublishSettling` is the part of ``MemoryClient`` that does this
(``_settle`` and the methods it calls), apart from the reads and the message
building; the client is its only user.
"""

from __future__ import annotations

import asyncio
import re
import time

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck

from memq.contracts.backoff import doubling, equal_jitter
from memq.contracts.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    MemqError,
    Oversize,
    PublishFailed,
    PublishOutcomeUnknown,
    QuotaExceeded,
)
from memq.contracts.landing import MSG_ID, fresh_id, holds
from memq.contracts.subjects import app_events_stream

EXPECTED_STREAM_MISMATCH = 10060  # JetStream err_code: the subject is in another stream
STREAM_FULL = (10077, 10078)  # JetStream err_codes: maximum bytes / messages exceeded (discard new)
JS_TEMPORARILY_UNAVAILABLE = 10008  # JetStream err_code (a 503; other 503s, such as a full stream, are final)
PUBLISH_DEADLINE = 30.0  # seconds to settle a publish; well inside the default 120 s duplicate window
RETRY_DELAYS = (0.05, 1.0)  # backoff between tries of one publish: first, most (doubling, jittered)
WRONG_LAST_SEQUENCE = 10071  # JetStream err_code: "wrong last sequence: N" (an expect_seq refused)
EXPECT_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
Prepared = tuple[str, bytes, dict[str, str]]  # subject, payload, headers


class PublishSettling:
    """Publishing until acknowledged, for :class:`~memq.contracts.client.MemoryClient`
    (its base class): the attributes below are the client's."""

    nc: Client
    _js: JetStreamContext
    app: str
    # The stream expected to capture the app's subjects (Nats-Expected-Stream),
    # the first of ``_streams`` until JetStream says it is another.
    stream: str
    _streams: tuple[str, ...]
    timeout: float
    publish_deadline: float
    verify_duplicates: bool
    duplicates: int
    squatted: int
    last_seq: int | None

    def _denied(self, subject: str) -> str | None:
        """The server's permissions violation for ``subject``, if that is why
        nothing came back (the client's: it names the app's inbox)."""
        raise NotImplementedError

    async def _settle(self, messages: list[Prepared]) -> list[int]:
        """Publish ``messages`` (one subject's, in order) until JetStream has
        acknowledged each one; their sequences, in input order.

        A try whose outcome is unknown (no PubAck within ``timeout``: the ack
        or the connection was lost) or that failed for now (disconnected with
        nats-py's buffer full, JetStream temporarily unavailable, no stream
        answering during a failover) is made again, backing off, with the same messages and so
        the same ``Nats-Msg-Id``: JetStream answers a stored one as a
        duplicate with its original sequence. Unacknowledged messages go again
        in input order, so one whose first try was lost lands after later ones
        that were stored. A definite refusal raises at once; once
        ``publish_deadline`` has passed, :class:`PublishOutcomeUnknown` if a
        try may have been stored, else :class:`PublishFailed`.
        """
        subject = messages[0][0]
        acks: list[PubAck | None] = [None] * len(messages)
        started = time.monotonic()
        retries = 0
        slow = 0  # tries whose acks did not come within their wait
        wait = self.timeout
        maybe_stored = False  # a try got no answer: a later refusal does not prove it was not stored
        while True:
            delay = doubling(retries, *RETRY_DELAYS)
            failures = await self._try(messages, [i for i, ack in enumerate(acks) if ack is None], acks, wait)
            if not failures:
                break
            if self._elsewhere(failures):
                continue  # nothing was stored: the same messages, expecting the app's other stream
            definite = [f for f in failures if not self._transient(f, subject)]
            timed_out = any(isinstance(f, TimeoutError) and f not in definite for f in failures)
            maybe_stored |= timed_out
            if definite or time.monotonic() + delay > started + self.publish_deadline:
                exc = (definite or failures)[0]
                unacked = tuple(messages[i][2]["Nats-Msg-Id"] for i, ack in enumerate(acks) if ack is None)
                raise self._failed(
                    exc, subject, unacked if maybe_stored else (), time.monotonic() - started, wait
                ) from exc
            await asyncio.sleep(equal_jitter(delay))  # clients cut off together retry apart
            retries += 1
            if timed_out:
                # Acks slower than the timeout (a loaded server or machine):
                # wait twice as long next time, within the deadline, rather
                # than resend the same messages every `timeout` and load it more.
                slow += 1
                left = started + self.publish_deadline - time.monotonic()
                wait = max(self.timeout, min(doubling(slow, self.timeout), left))
        if self.verify_duplicates:
            await self._verify(messages, acks)
        seqs = [ack.seq for ack in acks if ack is not None]
        # The dedupe id holds the subject and a digest of the bytes: a
        # duplicate is this very message, stored before (an earlier try, or the
        # caller publishing it again), and its original sequence is the answer.
        self.duplicates += sum(1 for ack in acks if ack is not None and ack.duplicate)
        self._published(max(seqs))
        return seqs

    async def _verify(self, messages: list[Prepared], acks: list[PubAck | None]) -> None:
        """Each duplicate ack that is not this very message (an id someone
        predicted and published first) is replaced by the ack of the message
        published again under a fresh id (its other headers as they were)."""
        for i, ack in enumerate(acks):
            if ack is None or not ack.duplicate:
                continue
            subject, data, headers = messages[i]
            if await holds(self._js, ack.stream, ack.seq, subject, data):
                continue
            new_id = fresh_id(headers[MSG_ID])
            try:
                acks[i] = await self._js.publish(subject, data, stream=self.stream, headers={**headers, MSG_ID: new_id})
            except (nats.errors.Error, TimeoutError) as exc:
                raise PublishFailed(
                    f"Nats-Msg-Id {headers[MSG_ID]!r} was another message's (seq {ack.seq}), and publishing "
                    f"again as {new_id!r} failed: {type(exc).__name__}: {exc}"
                ) from exc
            self.squatted += 1

    async def _try(
        self, messages: list[Prepared], todo: list[int], acks: list[PubAck | None], wait: float
    ) -> list[BaseException]:
        """One try at ``messages[todo]``, waiting ``wait`` seconds for the
        acks: fills ``acks``, returns the failures.

        The first is awaited alone: nats-py drops JetStream's errors of
        publish_async (nats.py#985: they surface only as a timeout), so a
        refusal comes back here with its reason; if it fails, the rest waits
        for the next try, in order."""
        subject, data, headers = messages[todo[0]]
        try:
            acks[todo[0]] = await self._js.publish(subject, data, timeout=wait, stream=self.stream, headers=headers)
        except (nats.errors.Error, TimeoutError) as exc:
            return [exc]
        failures: list[BaseException] = []
        futures: dict[int, asyncio.Future[PubAck]] = {}
        try:
            try:
                for i in todo[1:]:
                    subject, data, headers = messages[i]
                    futures[i] = await self._js.publish_async(subject, data, stream=self.stream, headers=headers)
            except (nats.errors.Error, TimeoutError) as exc:  # the rest of this try is not sent
                failures.append(exc)
            if futures:  # publish_async futures have no timeout of their own
                await asyncio.wait(futures.values(), timeout=wait)
        finally:
            for future in futures.values():
                future.cancel()  # if still pending: frees its slot in nats-py's pending limit
        for i, future in futures.items():
            if future.cancelled():
                failures.append(nats.errors.TimeoutError())
            elif (error := future.exception()) is not None:
                failures.append(error)
            else:
                acks[i] = future.result()
        return failures

    def _elsewhere(self, failures: list[BaseException]) -> bool:
        """Whether a refusal said the subject is in another stream and the
        app has another stream name to expect (``MEMQ_EVENTS``, or its own
        ``MEMQ_EVENTS_<app>`` in a deployment that gives it one); if so, the
        next try expects that one, and later publishes too."""
        if not any(isinstance(f, nats.js.errors.APIError) and f.err_code == EXPECTED_STREAM_MISMATCH for f in failures):
            return False
        later = self._streams[self._streams.index(self.stream) + 1 :]
        # Neither: the refusal stands, and the next publish starts again from the first.
        self.stream = later[0] if later else self._streams[0]
        return bool(later)

    def _published(self, seq: int) -> None:
        # max: concurrent publishes may be acked out of order, and a duplicate
        # gets its original (older) sequence back.
        self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)

    def _transient(self, exc: BaseException, subject: str) -> bool:
        """Whether trying the same publish again may succeed: no answer in
        time (it may have been stored), or not stored for now."""
        if isinstance(exc, TimeoutError):
            return not self._denied(subject)
        if isinstance(exc, nats.js.errors.NoStreamResponseError):
            # A stream that has acked this client is between leaders or still
            # recovering; one that never did is most likely missing: say so now.
            return self.last_seq is not None
        return isinstance(
            exc,
            (
                nats.errors.OutboundBufferLimitError,  # disconnected, nats-py's buffer full: not sent
                nats.errors.ConnectionReconnectingError,
                nats.errors.StaleConnectionError,
            ),
        ) or (isinstance(exc, nats.js.errors.APIError) and exc.err_code == JS_TEMPORARILY_UNAVAILABLE)

    def _failed(
        self,
        exc: BaseException,
        subject: str,
        unacked: tuple[str, ...] = (),
        elapsed: float = 0.0,
        wait: float | None = None,
    ) -> MemqError:
        """The error of a publish that failed with ``exc``; ``unacked``: the
        ids of messages left unacknowledged that an earlier try may have stored."""
        if isinstance(exc, nats.js.errors.APIError) and exc.err_code == WRONG_LAST_SEQUENCE and not unacked:
            return conflict(exc, subject)
        if isinstance(exc, TimeoutError) and (denied := self._denied(subject)):
            return Forbidden(f"publish to {subject} refused by NATS: {denied}")
        if isinstance(exc, nats.errors.MaxPayloadError):
            return Oversize(f"publish to {subject} refused: larger than the server's max_payload")
        streams = " or ".join(self._streams)
        if (
            isinstance(exc, nats.js.errors.APIError)
            and exc.err_code in STREAM_FULL
            and self.stream == app_events_stream(self.app)
        ):
            return QuotaExceeded(
                f"publish to {subject} refused: app {self.app!r}'s stream {self.stream} is full "
                f"({exc.description}): its quota (streams.apps.<app>.max_bytes, or streams.app_max_bytes) is "
                "reached. Deleting sessions frees space; the operator can raise the quota"
            )
        if isinstance(exc, nats.js.errors.NoStreamResponseError):
            why = (
                f"no stream captures it ({streams}): run `memq init` or start a worker; where apps have "
                f"streams of their own (streams.apps), app {self.app!r} must be listed there"
            )
        elif isinstance(exc, nats.js.errors.APIError) and exc.err_code == EXPECTED_STREAM_MISMATCH:
            why = f"the subject is not captured by stream {streams} ({exc.description})"
        elif isinstance(exc, TimeoutError):
            why = f"no acknowledgement from JetStream within {wait or self.timeout:g}s"
        else:
            why = f"{type(exc).__name__}: {exc}"
        if unacked:
            return PublishOutcomeUnknown(
                f"publish to {subject}: outcome unknown after {elapsed:.1f}s of tries (last: {why}); "
                f"{len(unacked)} message(s) may have been stored, the first with Nats-Msg-Id {unacked[0]!r}. "
                "Publishing the same event again (same event id) is safe; a new event may store a duplicate",
                subject,
                unacked,
            )
        return PublishFailed(f"publish to {subject} failed: {why}")


def expecting(prepared: Prepared, expect_seq: int | None) -> Prepared:
    """``prepared`` with the expected-last-subject-sequence header, if any."""
    if expect_seq is None:
        return prepared
    if isinstance(expect_seq, bool) or not isinstance(expect_seq, int) or expect_seq < 0:
        raise InvalidRequest(f"expect_seq must be a stream sequence (an int >= 0), not {expect_seq!r}")
    subject, data, headers = prepared
    return subject, data, {**headers, EXPECT_LAST_SUBJECT_SEQ: str(expect_seq)}


def conflict(exc: nats.js.errors.APIError, subject: str) -> Conflict:
    """The typed refusal of an ``expect_seq``, with the sequence the server
    reports ("wrong last sequence: N")."""
    found = re.search(r"(\d+)\s*$", exc.description or "")
    last_seq = int(found.group(1)) if found else None
    has = f"its last message is at seq {last_seq}" if last_seq is not None else f"{exc.description}"
    return Conflict(
        f"publish to {subject} refused: another writer appended to the session first ({has}); "
        "reload the session and try again",
        last_seq=last_seq,
    )
