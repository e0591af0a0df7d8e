"""A durable JetStream pull consumer that hands batches to a handler.

It runs inside the worker process's FastStream app (:mod:`memq.workers.runtime.app`),
on the broker's own connection, started and stopped by the app's hooks; it
is not a FastStream subscriber, for measured reasons (against raw nats-py on
the same nats-server; ``tests/bench/runtime.py`` repeats the comparison):

- FastStream 0.7.8 with nats-py >= 2.15 loses gathered batches. Its
  ``PullSub(batch=True)`` loop catches nats-py's ``nats.errors.TimeoutError``,
  but ``fetch`` also raises a bare ``asyncio.TimeoutError`` when a top-up
  fetch runs out of time; the subscriber task then restarts and drops the
  messages it had gathered, which come back only after ``ack_wait`` (30 s by
  default): 20-25 lost batches in 15 s at batch 100 and a 20 ms window, in
  each of 3 runs. The query worker waits on the persistence consumer's ack
  floor, so each lost batch stalls read-your-writes for up to ``ack_wait``.
- Even without losses it is slower: a batch of 100 at 0.67-0.87x, one
  handler call per message at 0.12-0.14x.

This loop is short enough to own. It also decides when a batch is complete
(see :meth:`BatchConsumer._next_batch`): a batch goes to the handler as soon
as the stream has nothing more waiting, and is topped up only while it
keeps delivering, so one lone append is committed at once and batches still
fill under load (what arrives during a commit makes the next batch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace

import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import NotJSMessageError
from nats.js.api import ConsumerConfig, Header, StatusCode
from nats.js.errors import NotFoundError

from memq.workers.runtime.bus import patiently

log = logging.getLogger("memq.consumer")

Handler = Callable[[list[Msg]], Awaitable[None]]
JS_API = "$JS.API"  # memq's JetStream contexts use the default API prefix
REFUSED_PAUSE_S = 0.5  # after the server refuses or ends a pull request: a pause, not a loop


class BatchConsumer:
    """Fetch up to ``batch_size`` messages and await ``handler`` on each batch,
    up to ``concurrency`` batches at once (default 1: one after the other). A
    batch is handed over as soon as no more messages are waiting; while more
    are (the last one fetched says so), it is topped up for at most
    ``batch_wait_s``. The handler acks/naks; every replica runs the same
    loop on the same durable, and JetStream spreads the messages between them."""

    def __init__(
        self,
        nc: NATS,
        *,
        stream: str,
        subject: str,
        config: ConsumerConfig,
        handler: Handler,
        batch_size: int,
        batch_wait_s: float,
        idle_wait_s: float = 1.0,
        concurrency: int = 1,
        create: bool = True,
    ):
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.subject = subject
        if not config.durable_name:
            raise ValueError("a BatchConsumer's consumer is durable: name it (durable_name)")
        self.durable: str = config.durable_name
        self.config = config
        self.handler = handler
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_s
        self.idle_wait_s = idle_wait_s
        self.concurrency = concurrency
        self.create = create  # False: the consumer must exist (a rebuild's: made and deleted by its job)
        self._handling: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._feed: PullFeed | None = None

    async def start(self) -> None:
        await patiently(f"creating consumer {self.durable}", self._create_consumer)
        self._feed = PullFeed(self.nc, self.stream, self.durable, ahead=self.batch_size)
        await self._feed.start()
        self._task = asyncio.create_task(self._run(), name=f"consume {self.durable}")

    async def _create_consumer(self) -> None:
        """The durable consumer, unless it exists (as nats-py's pull_subscribe
        makes it: filtered on ``subject`` unless the config says otherwise)."""
        try:
            await self.js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            if not self.create:
                raise
            config = replace(self.config, name=self.durable)
            if not config.filter_subjects:
                config.filter_subject = self.subject
            await self.js.add_consumer(self.stream, config=config)

    @property
    def running(self) -> bool:
        """The fetch loop is alive (readiness)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Finish the batches in hand, then stop fetching. Unacked messages
        stay with the consumer and are redelivered to a replica: those
        delivered ahead are naked for that at once."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        if self._feed is not None:
            await self._feed.stop()  # else draining the connection waits on it
            self._feed = None

    async def _next_batch(self) -> list[Msg]:
        # What the feed holds goes at once; while the stream still holds
        # more for this consumer (the last message's metadata says how
        # many), the batch waits up to batch_wait_s for them. A lone append
        # is handed over the moment it lands.
        assert self._feed is not None  # started
        take = self._feed.take
        msgs = await take(self.batch_size, self.idle_wait_s)
        deadline = time.monotonic() + self.batch_wait_s
        while msgs and len(msgs) < self.batch_size and _more_waiting(msgs[-1]):
            remaining = deadline - time.monotonic()
            if remaining < 0.001:
                break
            more = await take(self.batch_size - len(msgs), remaining)
            if not more:
                break  # another replica took them
            msgs += more
        return msgs

    async def _run(self) -> None:
        # Up to ``concurrency`` batches are handled at once: the next one is
        # fetched while earlier ones wait on their database round trips. The
        # handler must allow it (the persistence worker's commits are
        # order-independent, as they are across replicas).
        slots = asyncio.Semaphore(self.concurrency)
        try:
            while not self._stopping.is_set():
                await slots.acquire()
                if self._stopping.is_set():  # asked to stop while the slots were full
                    slots.release()
                    break
                try:
                    msgs = await self._next_batch()
                except NatsError as exc:  # disconnected, reconnecting, no responders
                    slots.release()
                    log.warning("fetch failed (%s); retrying", exc or type(exc).__name__)
                    await asyncio.sleep(0.5)
                    continue
                except Exception:  # unexpected: say so loudly, but never stop consuming
                    slots.release()
                    log.exception("fetch failed unexpectedly; retrying in 5s")
                    await asyncio.sleep(5.0)
                    continue
                if not msgs:
                    slots.release()
                    continue
                task = asyncio.create_task(self._handle(msgs))
                self._handling.add(task)

                def handled(task: asyncio.Task, slots: asyncio.Semaphore = slots) -> None:
                    self._handling.discard(task)
                    slots.release()

                task.add_done_callback(handled)
        finally:
            if self._handling:  # stopping: the batches in hand finish and are acked
                await asyncio.gather(*self._handling, return_exceptions=True)

    async def _handle(self, msgs: list[Msg]) -> None:
        try:
            await self.handler(msgs)
        except Exception:  # a bug, not bad input: never drop the batch
            log.exception("handler failed on a batch of %d; redelivering later", len(msgs))
            for msg in msgs:
                try:
                    await msg.nak(delay=5.0)
                except NatsError:
                    pass  # redelivered after ack_wait anyway


class StreamConsumers:
    """One :class:`BatchConsumer` of the same durable on each of ``streams``
    (the events streams: one, or the shared one and each app's). Sequences
    are per stream, so a batch never mixes streams: the handler finds its
    stream in its messages (:func:`batch_stream`). ``serial`` runs one batch
    at a time across all of them (SQLite has one writer)."""

    def __init__(
        self,
        nc: NATS,
        streams: list[str],
        *,
        config: ConsumerConfig | Callable[[str], ConsumerConfig],
        handler: Handler,
        serial: bool = False,
        **options,
    ):
        """``config``: the durable's, or the function giving it for a stream
        (where it starts differs per stream); ``options``: :class:`BatchConsumer`'s."""
        if serial:
            lock = asyncio.Lock()

            async def one_at_a_time(msgs: list[Msg], handle: Handler = handler) -> None:
                async with lock:
                    await handle(msgs)

            handler = one_at_a_time
        config_of = config if callable(config) else (lambda _: config)
        self.each = [
            BatchConsumer(nc, stream=stream, config=config_of(stream), handler=handler, **options) for stream in streams
        ]

    @property
    def running(self) -> bool:
        return all(c.running for c in self.each)

    async def start(self) -> None:
        """Start each; if one cannot (its consumer is gone), stop those
        already started and raise what it raised."""
        started: list[BatchConsumer] = []
        try:
            for consumer in self.each:
                await consumer.start()
                started.append(consumer)
        except BaseException:
            await asyncio.gather(*(c.stop() for c in started), return_exceptions=True)
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.each))


def batch_stream(msgs: list[Msg]) -> str:
    """The stream a batch came from (every message of a batch is of one)."""
    return msgs[0].metadata.stream


def _more_waiting(msg: Msg) -> bool:
    """Whether the stream held more messages for this consumer when ``msg``
    was delivered (``num_pending``: not yet delivered to the consumer). Zero
    means a top-up fetch could only wait for messages that are not there, so
    the batch is committed now instead of ``batch_wait_s`` later."""
    try:
        return msg.metadata.num_pending > 0
    except NotJSMessageError:  # no metadata to go by: top up as before
        return True


class PullFeed:
    """A pull consumer's messages, asked for ahead: one standing request for
    up to ``ahead`` messages, which the server fills as they arrive, topped
    up once half of it is in hand or used. nats-py's ``fetch`` sends a
    request per call and makes a task, a timer and an inbox id for every
    message it waits on: on a lone agent's turn that was one more NATS
    write per commit (commit step 1.84-1.86 -> 1.20-1.57 ms), and draining
    a backlog the worker's CPU per 1,000 events went from 72 to 50-52 ms
    (docs/benchmarks). nats-py has no standing pull of its own.

    What the server says besides messages (ADR-13 statuses): ``408`` a
    request expired, with how many of its messages it did not send; ``409``
    a leadership change or a deleted consumer, which ends the requests;
    ``100`` an idle heartbeat. When nothing at all has come for two
    heartbeats (a reconnect, a restarted server forgets its requests), the
    requests are taken as gone and asked again.
    """

    def __init__(
        self, nc: NATS, stream: str, durable: str, *, ahead: int, expires_s: float = 5.0, heartbeat_s: float = 1.0
    ):
        self.nc = nc
        self.ahead = ahead
        self._next = f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._expires_ns = int(expires_s * 1e9)
        self._heartbeat_ns = int(heartbeat_s * 1e9)
        self._silent_s = 2 * heartbeat_s
        self._asked = 0  # messages requested that have not come, expired or been cancelled
        self._held: deque[Msg] = deque()  # delivered, not yet taken
        self._arrived = asyncio.Event()
        self._heard = time.monotonic()  # the server's last word on our inbox
        self._quiet_until = 0.0  # no request before this (after a refusal: no tight loop)
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)

    async def stop(self) -> None:
        """No more deliveries; what was delivered and not taken goes back
        (nak) for another replica now rather than after ``ack_wait``."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.drain()  # what is on its way still lands in _held
            except NatsError:
                pass  # the connection is gone: redelivered after ack_wait
        while self._held:
            try:
                await self._held.popleft().nak()
            except NatsError:
                pass

    async def take(self, n: int, timeout: float) -> list[Msg]:
        """Up to ``n`` messages, as soon as there is one; [] after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self._held:
            self._arrived.clear()  # before asking: what lands while we ask sets it again
            await self._ask()
            if self._held:
                break
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return []
            # Wake to ask again when a pause after a refusal ends, or when
            # the server may have gone silent.
            wake = min(remaining, self._silent_s)
            if self._quiet_until > now:
                wake = min(wake, self._quiet_until - now)
            try:
                async with asyncio.timeout(wake):
                    await self._arrived.wait()
            except TimeoutError:
                pass
        held = self._held
        taken = [held.popleft() for _ in range(min(n, len(held)))]
        await self._ask()
        return taken

    async def _ask(self) -> None:
        """Top the standing request up to ``ahead`` messages in hand, once
        half of them are used."""
        now = time.monotonic()
        if self._sub is None or now < self._quiet_until:
            return
        if self._asked and now - self._heard > self._silent_s:
            log.info("no word from the server for %.1fs on %s: asking again", now - self._heard, self._next)
            self._asked = 0
        want = self.ahead - self._asked - len(self._held)
        if want < max(1, self.ahead // 2) and self._asked:
            return
        if want <= 0:
            return
        request = {"batch": want, "expires": self._expires_ns, "idle_heartbeat": self._heartbeat_ns}
        await self.nc.publish(self._next, orjson.dumps(request), reply=self._inbox)
        self._asked += want
        self._heard = now  # the new request's heartbeats are due from now

    async def _on_message(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        headers = msg.headers or {}
        status = headers.get(Header.STATUS)
        if not status:
            self._asked = max(0, self._asked - 1)
            self._held.append(msg)
        elif status == StatusCode.CONTROL_MESSAGE:
            return  # an idle heartbeat: the requests are alive
        elif status in (StatusCode.REQUEST_TIMEOUT, StatusCode.CONFLICT):
            # An expired request (or one ended early) says how many of its
            # messages will not come; a leadership change or a deleted
            # consumer ends them all.
            left = headers.get("Nats-Pending-Messages", "")
            if left.isdigit():
                self._asked = max(0, self._asked - int(left))
            else:
                self._asked = 0
            if status == StatusCode.CONFLICT:
                log.warning("pull request ended: %s %s", status, headers.get(Header.DESCRIPTION, ""))
                self._quiet_until = self._heard + REFUSED_PAUSE_S
        else:
            log.warning("unexpected status on the pull inbox: %s %s", status, headers.get(Header.DESCRIPTION, ""))
            self._asked = 0
            self._quiet_until = self._heard + REFUSED_PAUSE_S
        self._arrived.set()
