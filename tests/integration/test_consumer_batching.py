"""When the batch consumer hands a batch over: at once when nothing more is
waiting (an idle agent's append is not held for ``batch_wait_s``), and full
batches while the stream keeps delivering."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from helpers import stays_false, wait_for
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from memq.workers.runtime.consumer import BatchConsumer

STREAM = "BATCHING"
SUBJECT = "batching.>"


async def _consumer(nc, handler, batch_size: int, batch_wait_s: float, concurrency: int = 1) -> BatchConsumer:
    await nc.jetstream().add_stream(name=STREAM, subjects=[SUBJECT])
    consumer = BatchConsumer(
        nc,
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

    # A window far above a loaded machine's delivery time, so the bound
    # below tells holding from not holding (0.5 s against 0.25 s did not).
    consumer = await _consumer(nc, handler, batch_size=100, batch_wait_s=5.0)
    try:
        for i in range(3):  # each one alone, as an idle agent appends
            sent = time.monotonic()
            await js.publish("batching.one", f"{i}".encode())
            at, size = await asyncio.wait_for(handed.get(), 30)
            assert size == 1
            # The old loop topped the batch up for the whole window.
            assert at - sent < 2.5, f"a lone message waited {at - sent:.3f}s for a batch to fill"
    finally:
        await consumer.stop()
        await nc.close()


async def test_batches_fill_up_while_messages_keep_coming(nats_url):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sizes: list[int] = []
    holding, release = asyncio.Event(), asyncio.Event()

    async def handler(msgs: list[Msg]) -> None:
        holding.set()
        await release.wait()  # a slow commit: the burst piles up behind it
        for msg in msgs:
            await msg.ack()
        sizes.append(len(msgs))

    consumer = await _consumer(nc, handler, batch_size=100, batch_wait_s=0.5)
    try:
        await js.publish("batching.first", b"first")
        await asyncio.wait_for(holding.wait(), 30)  # the first batch is in the handler, alone
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

    consumer = await _consumer(nc, handler, batch_size=100, batch_wait_s=0.05, concurrency=2)
    try:
        await js.publish("batching.a", b"a")
        await wait_for(lambda: _true(started == [b"a"]), 30, "the first batch in its handler")
        await js.publish("batching.b", b"b")  # not in a's batch: that one is taken
        deadline = time.monotonic() + 5
        while len(started) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert started == [b"a", b"b"], "the second batch waited for the first one's handler"
        await js.publish("batching.c", b"c")
        feed = consumer._feed
        assert feed is not None
        # c is delivered (held, or taken by a slot that should not be free)
        await wait_for(lambda: _true(len(feed._held) + len(started) == 3), 30, "c delivered")
        await stays_false(
            lambda: _true(started != [b"a", b"b"]), 0.3, "more batches at once than the concurrency allows"
        )
    finally:
        release.set()
        await consumer.stop()  # the batches in hand finish and are acked
    assert {b"a", b"b"} <= set(acked), "stop() left a batch in hand unacked"
    await nc.close()


async def test_stop_hands_back_at_once_what_was_delivered_ahead(nats_url):
    """Messages the standing pull request brought in while the handler was
    busy are naked on stop: another replica has them now, not after
    ack_wait (30 s)."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    release = asyncio.Event()
    first: list[bytes] = []

    async def slow(msgs: list[Msg]) -> None:
        first.extend(m.data for m in msgs)
        await release.wait()
        for msg in msgs:
            await msg.ack()

    consumer = await _consumer(nc, slow, batch_size=10, batch_wait_s=0.01)
    try:
        await js.publish("batching.busy", b"busy")
        deadline = time.monotonic() + 5
        while not first and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for i in range(5):  # delivered ahead, held: the only slot is busy
            await js.publish("batching.ahead", f"{i}".encode())
        feed = consumer._feed
        assert feed is not None
        await wait_for(lambda: _true(len(feed._held) == 5), 30, "the five delivered ahead")
        release.set()
        await consumer.stop()
        assert first == [b"busy"]
        seconds = (await js.consumer_info(STREAM, "batching")).config.ack_wait
        assert seconds is not None and seconds >= 30
        got: list[bytes] = []

        async def quick(msgs: list[Msg]) -> None:
            for msg in msgs:
                await msg.ack()
            got.extend(m.data for m in msgs)

        other = await _consumer(nc, quick, batch_size=10, batch_wait_s=0.01)
        try:
            deadline = time.monotonic() + 5
            while len(got) < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert sorted(got) == [b"0", b"1", b"2", b"3", b"4"]
        finally:
            await other.stop()
    finally:
        release.set()
        await nc.close()


@pytest.mark.parametrize("crash", [False, True])
async def test_after_a_server_restart_the_lost_pull_request_is_asked_again(fresh_nats, crash):
    """A restarted nats-server forgets the standing request. Stopped, it
    says so (409); killed, it says nothing, its heartbeats stop, and the
    feed asks again (the old fetch timed out each second)."""
    nc = await nats.connect(fresh_nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    js = nc.jetstream()
    handed: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(msgs: list[Msg]) -> None:
        for msg in msgs:
            await msg.ack()
            handed.put_nowait(msg.data)

    consumer = await _consumer(nc, handler, batch_size=10, batch_wait_s=0.01)
    try:
        await js.publish("batching.before", b"before")
        assert await asyncio.wait_for(handed.get(), 5) == b"before"
        await asyncio.to_thread(fresh_nats.kill if crash else fresh_nats.stop)
        await asyncio.to_thread(fresh_nats.start)
        deadline = time.monotonic() + 10
        while not nc.is_connected and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await js.publish("batching.after", b"after", timeout=5)
        # A killed server may not have stored the ack of "before" and
        # deliver it again (at least once): "after" is what must come.
        deadline = time.monotonic() + 8
        while (got := await asyncio.wait_for(handed.get(), deadline - time.monotonic())) != b"after":
            assert got == b"before"
    finally:
        await consumer.stop()
        await nc.close()


async def test_an_expired_pull_request_is_renewed(nats_url):
    """The standing request expires while idle (408, with how many it did
    not send); the next one is asked for, so a message after that is
    delivered at once."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    handed: asyncio.Queue[float] = asyncio.Queue()

    async def handler(msgs: list[Msg]) -> None:
        for msg in msgs:
            await msg.ack()
            handed.put_nowait(time.monotonic())

    consumer = await _consumer(nc, handler, batch_size=10, batch_wait_s=0.01)
    # Its loop has not run yet (no await since start): the first request is
    # made with these.
    assert consumer._feed is not None
    consumer._feed._expires_ns = int(0.3e9)  # expire often (heartbeats every 0.1 s)
    consumer._feed._heartbeat_ns = int(0.1e9)
    consumer._feed._silent_s = 60.0  # only the 408 can renew it here
    try:
        await asyncio.sleep(1.5)  # several requests expire
        sent = time.monotonic()
        await js.publish("batching.late", b"late")
        at = await asyncio.wait_for(handed.get(), 5)
        assert at - sent < 0.25, f"waited {at - sent:.3f}s: the expired request was not renewed at once"
    finally:
        await consumer.stop()
        await nc.close()


async def _true(value: bool) -> bool:
    return value
