"""Steady load for the fault suite: sessions appending events at a fixed
rate, and a ledger of what was published and what JetStream acknowledged.

An event counts as acked only once its publish returned a stream sequence.
A publish that fails is retried with the *same* event (same id, so the same
``Nats-Msg-Id``: JetStream answers a duplicate with the original sequence);
one that still fails after ``give_up_s`` is recorded as not acked. Such an
event may still have reached the stream (its ack was lost): SQL may then
hold it, but only once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError
from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, Message, TextPart

SessionRef = tuple[str, str]  # (user, session)


@dataclass
class Sent:
    """One event the driver published (or tried to)."""

    event_id: str
    user: str
    session: str
    token: str  # a word no other event contains: a keyword search finds exactly it
    seq: int | None = None  # the acked stream sequence; None: not (yet) acked
    attempts: int = 0
    started: float = 0.0  # monotonic: the first publish attempt
    acked_at: float | None = None  # monotonic: when its ack came back


@dataclass
class Ledger:
    """Everything published, in publish order per session. Pure bookkeeping."""

    app: str
    sent: dict[str, Sent] = field(default_factory=dict)
    sessions: dict[SessionRef, list[Sent]] = field(default_factory=dict)
    given_up: int = 0

    def add(self, user: str, session: str, event_id: str, token: str) -> Sent:
        s = Sent(event_id, user, session, token)
        self.sent[event_id] = s
        self.sessions.setdefault((user, session), []).append(s)
        return s

    def acked(self, ref: SessionRef) -> list[Sent]:
        """The session's acked events, oldest first."""
        return [s for s in self.sessions.get(ref, []) if s.seq is not None]

    def all_acked(self) -> list[Sent]:
        return [s for s in self.sent.values() if s.seq is not None]

    def session_key(self, s: Sent) -> str:
        return scope_key(self.app, s.user, s.session)


class LoadDriver:
    """``sessions`` sessions (spread over ``users`` users), each appending one
    event every ``1 / rate_per_session`` seconds, one at a time: a session
    waits for its event's ack (or gives up on it) before the next."""

    def __init__(
        self,
        client: MemoryClient,
        ledger: Ledger,
        *,
        sessions: int = 4,
        users: int = 2,
        rate_per_session: float = 4.0,
        give_up_s: float = 20.0,
        retry_s: float = 0.25,
    ):
        self.client = client
        self.ledger = ledger
        self.refs: list[SessionRef] = [(f"user{i % users}", f"sess{i}") for i in range(sessions)]
        self.interval = 1.0 / rate_per_session
        self.give_up_s = give_up_s
        self.retry_s = retry_s
        self.publish_errors: dict[str, int] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._session(ref), name=f"load {ref}") for ref in self.refs]

    async def stop(self) -> None:
        """Stop appending; events in flight still finish (acked or given up)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _session(self, ref: SessionRef) -> None:
        user, session = ref
        n = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            role = "user" if n % 2 == 0 else "assistant"
            token = f"tok{uuid.uuid4().hex[:12]}"
            event = Event(
                author=user if role == "user" else "agent",
                message=Message(role=role, parts=[TextPart(text=f"{session} turn {n}: remember {token}")]),
            )
            await self._publish(self.ledger.add(user, session, event.id, token), event)
            n += 1
            next_at += self.interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - self.interval)  # no burst after a long outage

    async def _publish(self, sent: Sent, event: Event) -> None:
        sent.started = time.monotonic()
        deadline = sent.started + self.give_up_s
        while True:
            sent.attempts += 1
            try:
                sent.seq = await self.client.append(sent.user, sent.session, event)
                sent.acked_at = time.monotonic()
                return
            except MemqError as exc:
                self.publish_errors[exc.code] = self.publish_errors.get(exc.code, 0) + 1
                if time.monotonic() > deadline:
                    self.ledger.given_up += 1
                    return
                await asyncio.sleep(self.retry_s)
