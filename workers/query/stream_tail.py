"""Read-your-writes without waiting for the commit: a session's messages
between the commit floor and a read's ``min_seq``, held by the query
worker as the stream delivers them, added to what SQL holds.

An agent's turn is an append, then a read of its session that must hold
it. Waiting for the commit put the whole persistence path (fetch, commit,
ack, notice) inside every turn, though the stream already holds the
message. Each query replica follows the events stream with an ordered
consumer (nats-py's: every message once, in stream order; it restarts
itself after the message it saw last on a gap or a stall) and keeps the
messages above the commit floor in memory. What they add to a read, and
when the read must wait for the commit after all, is pure logic
(:mod:`memq.workers.memory.tail`).

A first try read the messages with a JetStream get each (``next_by_subj``):
three round trips a read cost more than the commit wait saved, on 2 cores
and on 16 (see the benchmarks). Held in memory, the tail costs no round
trip, and the answer is exact because of what is checked, and when:

1. every message from floor + 1 on is held (none dropped for room, none
   pruned: a read pins its floor), and the consumer has delivered
   ``min_seq``, so it holds all of the session's messages up to it;
2. the SQL read (the window) comes first; then the consumer must have
   delivered the session's newest committed message too (``last_seq``):
   so it holds every message that SQL's answer depends on, and
3. a message on the user's subject since the floor (a user delete, which
   may have committed before 2) makes the read wait;
4. the events' ids are looked up in SQL, in the window's own statement
   where it is one: one the session holds at another seq is not written
   again.

Answers read this way are not cached: the commit drops them anyway. Off
by default (``query.read_tail``): measured, the lone agent's turn gained
little on shared cores and 16 agents ran 16 % fewer turns/s, since every
replica also handles every message (docs/benchmarks).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts.codec import decode_from_subject
from memq.contracts.errors import MemqError
from memq.contracts.ids import scope_key
from memq.contracts.subjects import EVENTS_WILDCARD, events_subject
from memq.workers.memory.commit_plan import Incoming
from memq.workers.memory.tail import MustWait, tail_events
from memq.workers.memory.tokens import encoding_for
from memq.workers.sql import reads


class StreamTail:
    """The events stream's messages above the commit floor, in memory.

    :param floor: the commit floor as known now, without I/O: messages at or
        below it are committed, and dropped (unless a read pins them).
    :param max_messages: messages held at most; beyond, the oldest are
        dropped, and reads that need them wait for the commit.
    :param max_bytes: the persistence worker's decode limit (bigger ones are
        dead-lettered, so skipped here too).
    :param catch_up_s: how long a read waits for the consumer to deliver
        what it needs (it usually has: delivery comes with the PubAck).
    """

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        floor: Callable[[], int],
        *,
        max_messages: int,
        max_bytes: int,
        catch_up_s: float = 0.05,
    ):
        self.js = js
        self.stream = stream
        self.floor = floor
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.catch_up_s = catch_up_s
        self.held_after = 2**63  # every message above this is held, up to `seen` (none before start())
        self.seen = 0  # the newest stream seq delivered
        self._order: deque[tuple[int, str]] = deque()  # (seq, subject), oldest first
        self._by_subject: dict[str, deque[tuple[int, bytes]]] = {}
        self._pins: Counter[int] = Counter()  # floors that reads in flight started from
        self._delivered = asyncio.Event()  # set, and replaced, at each delivery
        self._sub: Subscription | None = None

    async def start(self) -> None:
        """Follow the stream from its next message: a read whose floor is
        below that waits for the commit (nothing older is held)."""
        # Tail reads count tokens as the persistence worker does (loading
        # the encoding takes ~0.2 s): not on the first read.
        await asyncio.to_thread(encoding_for)
        last = (await self.js.stream_info(self.stream)).state.last_seq
        self.held_after = self.seen = last
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=last + 1)
        self._sub = await self.js.subscribe(
            EVENTS_WILDCARD, stream=self.stream, ordered_consumer=True, config=config, cb=self._on_message
        )

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except NatsError:  # the connection is already gone
                pass
            self._sub = None

    def reader(self, app: str, user: str, session: str, *, after: int, upto: int) -> SessionTail:
        """One read's tail: the session's messages in (``after``, ``upto``];
        ``after`` is the commit floor known now (pinned until ``close()``)."""
        return SessionTail(self, app, user, session, after, upto)

    # --- the consumer ---------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.seen:  # a restarted consumer repeats nothing, but be sure
            return
        self.seen = seq
        self._order.append((seq, msg.subject))
        held = self._by_subject.get(msg.subject)
        if held is None:
            held = self._by_subject[msg.subject] = deque()
        held.append((seq, msg.data))
        self._prune()
        self._delivered.set()
        self._delivered = asyncio.Event()

    def _prune(self) -> None:
        limit = self.floor()
        if self._pins:
            limit = min(limit, min(self._pins))
        if len(self._order) > self.max_messages:  # no room: drop the oldest anyway
            limit = max(limit, self._order[len(self._order) - self.max_messages - 1][0])
        while self._order and self._order[0][0] <= limit:
            seq, subject = self._order.popleft()
            held = self._by_subject[subject]
            held.popleft()
            if not held:
                del self._by_subject[subject]
            self.held_after = max(self.held_after, seq)

    async def caught_up(self, seq: int) -> bool:
        """Has the consumer delivered ``seq``? Wait ``catch_up_s`` at most."""
        try:
            async with asyncio.timeout(self.catch_up_s):
                while self.seen < seq:
                    await self._delivered.wait()
        except TimeoutError:
            pass
        return self.seen >= seq

    def held(self, subject: str, after: int, upto: int) -> list[tuple[int, bytes]]:
        """The held messages on ``subject`` with seq in (``after``, ``upto``]."""
        return [(seq, data) for seq, data in self._by_subject.get(subject, ()) if after < seq <= upto]


class Tail(Protocol):
    """What a read's uncommitted appends offer the ops (this module's
    SessionTail, or :class:`memq.workers.query.carried.CarriedTail`).
    ``after``: the commit floor they extend SQL from."""

    after: int

    async def appended(self) -> list[dict[str, Any]]: ...

    async def events(
        self, conn: AsyncConnection, rows: list[dict[str, Any]], last_seq: int, stored: dict[str, int] | None
    ) -> list[reads.StoredEvent]: ...

    def close(self) -> None: ...


async def not_stored_elsewhere(
    conn: AsyncConnection, session_key: str, rows: list[dict[str, Any]], stored: dict[str, int] | None
) -> list[reads.StoredEvent]:
    """``rows`` less those whose event id the session holds at another seq
    (``stored``: the ids the window's read found; None: look them up now)."""
    if stored is None:
        stored = await reads.stored_event_ids(conn, session_key, [r["event_id"] for r in rows])
    # An id stored at this very seq is this message, committed since the
    # window was read (the window lacks it): it stays.
    return [
        reads.StoredEvent(r["seq"], r["event_id"], r["author"], r["role"], r["timestamp"], r["data"], r["tokens"])
        for r in rows
        if stored.get(r["event_id"], r["seq"]) == r["seq"]
    ]


class SessionTail:
    """One read's tail (see :class:`StreamTail`): pins the floor it starts
    from, so that nothing above it is dropped until :meth:`close`."""

    def __init__(self, tail: StreamTail, app: str, user: str, session: str, after: int, upto: int):
        self.tail = tail
        self.session_key = scope_key(app, user, session)
        self.subject = events_subject(app, user, session)
        self.user_subject = events_subject(app, user)
        self.after = after
        self.upto = upto
        tail._pins[after] += 1
        self._closed = False

    async def appended(self) -> list[dict[str, Any]]:
        """The event rows the session's messages in (``after``, ``upto``]
        append (:func:`memq.workers.memory.tail.tail_events`), before any
        SQL: their ids go with the SQL read. Raise :class:`MustWait` when
        they cannot be told without the commit."""
        tail = self.tail
        if self.after < tail.held_after:
            raise MustWait(f"messages after seq {self.after} are not all held")
        if not await tail.caught_up(self.upto):
            raise MustWait(f"the stream consumer has not delivered seq {self.upto}")
        items = []
        for seq, data in tail.held(self.subject, self.after, self.upto):
            try:
                items.append(Incoming(seq, decode_from_subject(self.subject, data, max_bytes=tail.max_bytes)))
            except MemqError:
                pass  # dead-lettered by the persistence worker: never written
            except Exception as exc:  # a decoder bug: the persistence worker's verdict is unknown here
                raise MustWait(f"seq {seq} did not decode ({type(exc).__name__})") from None
        return tail_events(items, self.session_key)

    async def events(
        self, conn: AsyncConnection, rows: list[dict[str, Any]], last_seq: int, stored: dict[str, int] | None
    ) -> list[reads.StoredEvent]:
        """``rows`` (from :meth:`appended`) as SQL will hold them. Call it
        after the SQL read they extend, with the session's ``last_seq`` as
        that read found it and the ids it found (``stored``; None: look them
        up now). Raise :class:`MustWait` when they need the commit."""
        tail = self.tail
        if not await tail.caught_up(last_seq):
            raise MustWait(f"the stream consumer has not delivered seq {last_seq}")
        if tail.held(self.user_subject, self.after, tail.seen):
            raise MustWait(f"the user has messages after seq {self.after}")
        return await not_stored_elsewhere(conn, self.session_key, rows, stored)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            pins = self.tail._pins
            pins[self.after] -= 1
            if not pins[self.after]:
                del pins[self.after]
