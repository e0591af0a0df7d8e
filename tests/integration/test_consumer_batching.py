"""When the batch consumer hands a batch over: at once when nothing more is
waiting (an idle agent's append is not held for ``batch_wait_s``), and full
batches while the stream keeps delivering."""

from __future__ import annotations

import asyncio
import time

import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from memq.workers.consumer import BatchConsumer

STREAM = "BATCHING"
SUBJECT = "batching.>"


async def _consumer(js, handler, batch_size: int, batch_wait_s: float, concurrency: int = 1) -> BatchConsumer:
    await js.add_stream(name=STREAM, subjects=[SUBJECT])
    consumer = BatchConsumer(
        js,
        stream=STREAM,
        subject=SUBJECT,
        config=ConsumerConfig(durable_name="batching", ack_policy=AckPolicy.EXPLICIT),
        handler=handler,
        batch_size=batch_size,
        batch_wait_s=batch_wait_s,
        idle_wait_s=0.2,
        concurrency=concurrency,
    )
    await consumer.start()
    return consumer


async def test_a_lone_message_is_handed_over_without_waiting_for_the_batch_window(nats_url):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    handed: asyncio.Queue[tuple[float, int]] = asyncio.Queue()

    async def handler(msgs: list[Msg]) -> None:
        for msg in msgs:
            await msg.ack()
        handed.put_nowait((time.monotonic(), len(msgs)))

    consumer = await _consumer(js, handler, batch_size=100, batch_wait_s=0.5)
    try:
        for i in range(3):  # each one alone, as an idle agent appends
            sent = time.monotonic()
            await js.publish("batching.one", f"{i}".encode())
            at, size = await asyncio.wait_for(handed.get(), 5)
            assert size == 1
            # The old loop topped the batch up for the whole 0.5 s window.
            assert at - sent < 0.25, f"a lone message waited {at - sent:.3f}s for a batch to fill"
    finally:
        await consumer.stop()
        await nc.close()


async def test_batches_fill_up_while_messages_keep_coming(nats_url):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sizes: list[int] = []
    release = asyncio.Event()

    async def handler(msgs: list[Msg]) -> None:
        await release.wait()  # a slow commit: the burst piles up behind it
        for msg in msgs:
            await msg.ack()
        sizes.append(len(msgs))

    consumer = await _consumer(js, handler, batch_size=100, batch_wait_s=0.5)
    try:
        await js.publish("batching.first", b"first")
        await asyncio.sleep(0.2)  # the first batch is in the handler
        # publish_async hands back a future of the PubAck: the burst is
        # stored before the handler lets go.
        acks = await asyncio.gather(*(js.publish_async(f"batching.burst.{i % 7}", b"x") for i in range(250)))
        await asyncio.gather(*acks)
        release.set()
        deadline = time.monotonic() + 10
        while sum(sizes) < 251 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sizes == [1, 100, 100, 50]
    finally:
        await consumer.stop()
        await nc.close()


async def test_with_concurrency_the_next_batch_is_handled_while_one_waits_and_stop_finishes_both(nats_url):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    started: list[bytes] = []
    release = asyncio.Event()
    acked: list[bytes] = []

    async def handler(msgs: list[Msg]) -> None:
        started.extend(m.data for m in msgs)
        await release.wait()  # a commit waiting on the database
        for msg in msgs:
            await msg.ack()
        acked.extend(m.data for m in msgs)

    consumer = await _consumer(js, handler, batch_size=100, batch_wait_s=0.05, concurrency=2)
    try:
        await js.publish("batching.a", b"a")
        await asyncio.sleep(0.3)
        await js.publish("batching.b", b"b")
        deadline = time.monotonic() + 5
        while len(started) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert started == [b"a", b"b"], "the second batch waited for the first one's handler"
        await js.publish("batching.c", b"c")
        await asyncio.sleep(0.3)
        assert started == [b"a", b"b"], "more batches at once than the concurrency allows"
    finally:
        release.set()
        await consumer.stop()  # the batches in hand finish and are acked
    assert {b"a", b"b"} <= set(acked), "stop() left a batch in hand unacked"
    await nc.close()
