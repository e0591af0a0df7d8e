"""App A, with only its own credentials, names a reply subject that is not
its own: whatever answers (the query worker, JetStream's PubAck) must not
write there. Each attack aims at something of memq's or of app B's, and each
test asserts on the target, not on a log line: nothing stored under B's
subjects or in the DLQ, B's inbox hears nothing, B's session is summarized.

A barrier follows each attack: an honest request on the same connection,
answered by the same query worker after the attack (one subscription,
in order), so a write the attack caused would already be under way.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from helpers import stays_false, wait_for

from memq.contracts.client import MemoryClient, app_inbox_prefix, build_request, encode_request
from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event
from memq.contracts.subjects import dlq_subject, events_subject, request_subject
from memq.workers.runtime import bus
from memq.workers.runtime.lease import BUCKET, lease_bucket

from .conftest import A, B, Tenants

pytestmark = pytest.mark.timeout(120)


def sessions_list(app: str) -> bytes:
    return encode_request(build_request(app, "sessions.list", user="alice"))


async def attack(tenants: Tenants, reply: str) -> None:
    """As A: a request on A's own subject, answered to ``reply``; then the barrier."""
    a = await tenants.app(A)
    try:
        await a.publish(request_subject(A, "sessions.list"), sessions_list(A), reply=reply)
        await a.request(request_subject(A, "sessions.list"), sessions_list(A), timeout=5)  # the barrier
    finally:
        await a.close()


async def test_a_reply_into_bs_event_subject_stores_nothing_there(tenants):
    target = events_subject(B, "bob", "bsess")
    await attack(tenants, target)

    async def stored() -> bool:
        return await tenants.stored(target) > 0

    await stays_false(stored, 1.0, f"a message stored under {target}")


async def test_a_reply_into_the_dlq_adds_no_dead_letter(tenants):
    before = await tenants.dead_letters()
    await attack(tenants, dlq_subject("persistence"))

    async def grew() -> bool:
        return await tenants.dead_letters() > before

    await stays_false(grew, 1.0, "a dead letter written by A")


async def test_a_reply_into_bs_inbox_never_reaches_b(tenants):
    b = await tenants.app(B)
    heard: list[bytes] = []
    inbox = f"{app_inbox_prefix(B)}.waiting-for-an-answer"

    async def got(msg) -> None:
        heard.append(msg.data)

    try:
        await b.subscribe(inbox, cb=got)
        await bus.settle(b)
        await attack(tenants, inbox)

        async def reached() -> bool:
            return bool(heard)

        await stays_false(reached, 1.0, "B's inbox receiving an answer to A's request")
    finally:
        await b.close()


async def test_a_cannot_hold_bs_summarizer_lease(tenants):
    """A writes B's session's lease key every 0.25 s (through the query
    worker's replies); B's session still gets its summary."""
    # The bucket as the summarizer makes it, so the attack has a target from the start.
    await lease_bucket(tenants.admin.jetstream(), tenants.settings.summarizer.lease_ttl_s)
    key = f"$KV.{BUCKET}.summarize.{scope_key(B, 'bob', 'leased')}"
    a = await tenants.app(A)

    async def hold() -> None:
        while True:
            await a.publish(request_subject(A, "sessions.list"), sessions_list(A), reply=key)
            await asyncio.sleep(0.25)

    holder = asyncio.create_task(hold())
    try:
        await asyncio.sleep(0.3)  # the first forged lease is in place before B writes
        async with await tenants.client(B) as b:
            for i in range(12):
                await b.append_text("bob", "leased", "user", f"Turn {i}: my sister Ana lives in Porto and sails.")

            async def summarized() -> bool:
                return (await b.history("bob", "leased")).summary is not None

            await wait_for(summarized, 20, "B's summary despite A's forged lease")
    finally:
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
        await a.close()


@pytest.mark.parametrize("target", ["B's event subject", "B's inbox"])
async def test_a_publish_with_a_foreign_reply_acks_only_to_a(tenants, target):
    """A's own event, with a reply subject of B's: JetStream stores the event
    and its PubAck must not land on B's subject."""
    b = await tenants.app(B)
    heard: list[bytes] = []

    async def got(msg) -> None:
        heard.append(msg.data)

    inbox = f"{app_inbox_prefix(B)}.pub-ack"
    foreign = events_subject(B, "bob", "acked") if target == "B's event subject" else inbox
    await b.subscribe(inbox, cb=got)
    await bus.settle(b)
    a = await tenants.app(A)
    try:
        client = MemoryClient(a, A)
        ((subject, data, headers),) = client._prepare_events(
            "alice",
            "forged-ack",
            [
                Event.model_validate(
                    {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]}}
                )
            ],
        )
        await a.publish(subject, data, reply=foreign, headers=headers)
        await a.flush()

        async def a_stored() -> bool:  # A's own write went through
            return await tenants.stored(subject) > 0

        await wait_for(a_stored, 5, "A's event stored")

        async def leaked() -> bool:
            return bool(heard) or await tenants.stored(events_subject(B, "bob", "acked")) > 0

        await stays_false(leaked, 1.0, f"a PubAck on {foreign}")
    finally:
        await a.close()
        await b.close()
