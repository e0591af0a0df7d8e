"""One durable per events stream (workers/runtime/consumer.py, StreamConsumers)
on a real nats-server: every batch comes from one stream and the handler
learns which; ``serial`` never runs two batches at once; a start that
fails on one stream leaves none of the others running."""

from __future__ import annotations

import asyncio

import nats
import pytest
from helpers import wait_for
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from nats.js.errors import NotFoundError

from memq.workers.runtime.consumer import StreamConsumers, batch_stream

CONFIG = ConsumerConfig(durable_name="test-durable", ack_policy=AckPolicy.EXPLICIT)


@pytest.fixture
async def nc(nats_url):
    conn = await nats.connect(nats_url)
    js = conn.jetstream()
    for name, subject in (("S_ONE", "one.>"), ("S_TWO", "two.>")):
        await js.add_stream(StreamConfig(name=name, subjects=[subject]))
    yield conn
    await conn.close()


async def test_each_batch_is_of_one_stream_and_serial_batches_never_overlap(nc) -> None:
    js = nc.jetstream()
    for i in range(30):
        await js.publish("one.x", f"{i}".encode())
        await js.publish("two.x", f"{i}".encode())
    seen: dict[str, list[int]] = {"S_ONE": [], "S_TWO": []}
    running = 0
    overlapped = False

    async def handle(msgs: list[Msg]) -> None:
        nonlocal running, overlapped
        running += 1
        overlapped = overlapped or running > 1
        stream = batch_stream(msgs)
        assert {m.metadata.stream for m in msgs} == {stream}
        await asyncio.sleep(0.01)  # a commit's round trip: room for another batch to start
        for msg in msgs:
            seen[stream].append(msg.metadata.sequence.stream)
            await msg.ack()
        running -= 1

    consumers = StreamConsumers(
        nc, ["S_ONE", "S_TWO"], subject=">", config=CONFIG, handler=handle, serial=True, batch_size=7, batch_wait_s=0.01
    )
    await consumers.start()
    try:
        assert consumers.running
        await wait_for(lambda: _true(all(len(s) == 30 for s in seen.values())), timeout=10, what="both streams")
    finally:
        await consumers.stop()
    assert not consumers.running
    assert seen == {"S_ONE": list(range(1, 31)), "S_TWO": list(range(1, 31))}  # sequences are per stream
    assert not overlapped


async def test_a_start_that_fails_on_one_stream_stops_the_others(nc) -> None:
    js = nc.jetstream()
    await js.add_consumer("S_ONE", CONFIG)  # S_TWO has none, and create=False may not make it

    async def handle(msgs: list[Msg]) -> None:
        raise AssertionError("nothing is consumed")

    consumers = StreamConsumers(
        nc,
        ["S_ONE", "S_TWO"],
        subject=">",
        config=CONFIG,
        handler=handle,
        batch_size=8,
        batch_wait_s=0.01,
        create=False,
    )
    with pytest.raises(NotFoundError):
        await consumers.start()
    assert not any(c.running for c in consumers.each)


async def _true(value: bool) -> bool:
    return value
