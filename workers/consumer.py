"""A durable JetStream pull consumer that hands batches to a handler.

It runs inside the worker process's FastStream app (:mod:`memq.workers.app`),
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
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NotJSMessageError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from memq.workers.bus import patiently

log = logging.getLogger("memq.consumer")

Handler = Callable[[list[Msg]], Awaitable[None]]
TIMEOUTS = (asyncio.TimeoutError, TimeoutError)  # nats-py raises both kinds


class BatchConsumer:
    """Fetch up to ``batch_size`` messages and await ``handler`` on each batch,
    up to ``concurrency`` batches at once (default 1: one after the other). A
    batch is handed over as soon as no more messages are waiting; while more
    are (the last one fetched says so), it is topped up for at most
    ``batch_wait_s``. The handler acks/naks; every replica runs the same
    loop on the same durable, and JetStream spreads the messages between them."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        subject: str,
        config: ConsumerConfig,
        handler: Handler,
        batch_size: int,
        batch_wait_s: float,
        idle_wait_s: float = 1.0,
        concurrency: int = 1,
    ):
        self.js = js
        self.stream = stream
        self.subject = subject
        self.config = config
        self.handler = handler
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_s
        self.idle_wait_s = idle_wait_s
        self.concurrency = concurrency
        self._handling: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._sub = await patiently(
            f"creating consumer {self.config.durable_name}",
            lambda: self.js.pull_subscribe(
                self.subject, durable=self.config.durable_name, stream=self.stream, config=self.config
            ),
        )
        self._task = asyncio.create_task(self._run(), name=f"consume {self.config.durable_name}")

    @property
    def running(self) -> bool:
        """The fetch loop is alive (readiness)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Finish the batch in hand, then stop fetching. Unacked messages stay
        with the consumer and are redelivered to a replica."""
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
            await self._sub.unsubscribe()  # else draining the connection waits on it

    async def _fetch(self, n: int, timeout: float) -> list[Msg]:
        try:
            return await self._sub.fetch(n, timeout=timeout)
        except TIMEOUTS:
            return []

    async def _next_batch(self) -> list[Msg]:
        # The first message is fetched alone: nats-py's fetch of one returns
        # the moment it lands. A fetch of n, once its first message is in,
        # waits for all n or its timeout (idle_wait_s) unless the server ends
        # the request; with two replicas sharing a trickle it often did not,
        # and a lone append waited up to that second (publish -> commit p99
        # at 1,000 events/s: 971 ms, now 6 ms). Returns after idle_wait_s
        # with nothing. What else is waiting comes with the top-up, which
        # asks with no_wait first and so brings what is there (up to the
        # batch size); a top-up only pays off for what arrived since, which
        # each message's metadata counts.
        msgs = await self._fetch(1, self.idle_wait_s)
        deadline = time.monotonic() + self.batch_wait_s
        while msgs and len(msgs) < self.batch_size and _more_waiting(msgs[-1]):
            remaining = deadline - time.monotonic()
            if remaining < 0.001:
                break
            more = await self._fetch(self.batch_size - len(msgs), remaining)
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


def _more_waiting(msg: Msg) -> bool:
    """Whether the stream held more messages for this consumer when ``msg``
    was delivered (``num_pending``: not yet delivered to the consumer). Zero
    means a top-up fetch could only wait for messages that are not there, so
    the batch is committed now instead of ``batch_wait_s`` later."""
    try:
        return msg.metadata.num_pending > 0
    except NotJSMessageError:  # no metadata to go by: top up as before
        return True
