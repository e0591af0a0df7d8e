"""A publish whose acks come later than ``timeout`` (a loaded server or
machine) settles: each try after one that got no answer waits longer, rather
than resending the same messages every ``timeout`` until the deadline."""

from __future__ import annotations

import asyncio

import nats.errors
from fakes import FakeNats
from nats.js.api import PubAck

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart

ACK_S = 0.5  # every ack takes this long
TIMEOUT_S = 0.2


class SlowJetStream:
    """Stores by Nats-Msg-Id (a duplicate gets its first sequence) and acks
    each publish ``ACK_S`` later, whatever the caller's timeout."""

    def __init__(self):
        self.seqs: dict[str, int] = {}
        self.tries = 0

    def _store(self, headers: dict) -> PubAck:
        msg_id = headers["Nats-Msg-Id"]
        duplicate = msg_id in self.seqs
        seq = self.seqs.setdefault(msg_id, len(self.seqs) + 1)
        return PubAck(stream="MEMQ_EVENTS", seq=seq, duplicate=duplicate or None)

    async def publish(self, subject, payload, timeout=None, stream=None, headers=None):
        self.tries += 1
        if timeout is not None and timeout < ACK_S:
            await asyncio.sleep(timeout)
            self._store(headers)  # stored all the same: only the ack was late
            raise nats.errors.TimeoutError
        await asyncio.sleep(ACK_S)
        return self._store(headers)

    async def publish_async(self, subject, payload, stream=None, headers=None):
        self.tries += 1

        async def ack() -> PubAck:
            await asyncio.sleep(ACK_S)
            return self._store(headers)

        return asyncio.ensure_future(ack())


def client(js: SlowJetStream) -> MemoryClient:
    return MemoryClient(FakeNats(js), "app", timeout=TIMEOUT_S, publish_deadline=3.0)  # type: ignore[arg-type]


def events(n: int) -> list[Event]:
    return [Event(message=Message(role="user", parts=[TextPart(text=f"turn {i}")])) for i in range(n)]


async def test_acks_slower_than_the_timeout_still_settle():
    js = SlowJetStream()
    seqs = await client(js).append_many("u", "s", events(20))
    assert seqs == list(range(1, 21))
    assert js.tries < 3 * 20  # not resent every 0.2 s for 3 s


async def test_one_append_settles_too():
    js = SlowJetStream()
    assert await client(js).append("u", "s", events(1)[0]) == 1
