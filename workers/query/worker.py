"""The query worker: sessions, history and model context over request/reply.

Requests arrive on ``memq.v1.q.<app>.<op>`` (core NATS, outside every stream),
in one queue group, so replicas share them. The worker registers as a NATS
micro service (``memq-query``: ping, info and stats for `memq status`). For
each request it:

1. drops, unanswered, a request whose reply subject is not the app's own
   inbox (:mod:`memq.workers.query.reply_subjects`), then validates the body and
   refuses one that names another app than its subject;
2. admits it to one of the replica's request slots without waiting, within
   its app's share of them, or refuses it ``busy`` at once
   (:mod:`memq.workers.query.slots`): no app can hold every slot, and the
   subscription's callback never blocks on one;
3. waits, bounded, until the caller's ``min_seq`` is committed (read-your-writes):
   on the commit floor (:mod:`memq.workers.runtime.commit_floor`), which the
   persistence replicas' notices move as they commit, so the read goes the
   moment its sequence and every one below it are in SQL. A waiting read
   gives its slot back meanwhile (its app may have ``query.app_waiting`` of
   them), and a ``min_seq`` beyond the stream's last sequence is refused at
   once (:mod:`memq.workers.query.stream_end`). With
   ``query.read_tail``, a history or context instead adds the session's
   uncommitted appends, held from the stream (:mod:`memq.workers.query.stream_tail`),
   and does not wait at all;
4. answers from the cache, or from SQL through the op in :mod:`memq.workers.query.ops`
   and fills the cache;
5. always replies to an accepted request: a typed error rather than silence or a hang.

Commit notices: what the persistence replicas finished with
(``memq.v1.committed.<durable>``, :class:`memq.contracts.notices.CommittedRanges`)
moves the commit floor and wakes the reads waiting on it, every replica
hearing every notice (no queue group). The same notice carries the batch's
commit notices, and the replica drops what they made stale in its own cache
tier *before* it moves the floor: a read woken by the notice then caches an
answer that holds the commit, which no later notice drops (on the separate
``memq.v1.changed.>`` subscription the invalidation came a few ms after the
wake-up, so every read after a write was cached, then dropped). The shared
(Redis) tier is invalidated from ``memq.v1.changed.>``
(:class:`memq.contracts.notices.CommitNotice`) by one replica per notice, a
FastStream subscriber. A lost notice only delays a read: the floor falls
back to the consumer's ack floor.

Indexing notices: the indexing replicas announce what they finished the
same way (``memq.v1.committed.<indexing durable>``), and the same kind of
subscription moves the indexing floor that a search's ``min_seq`` waits on
(search is read-your-writes by default in the client): the search goes the
moment the caller's write is indexed, and the indexing consumer's ack floor
is the fallback. They carry no commit notices (the index is not cached).

Why the committed notices are a nats-py subscription and not a FastStream
subscriber: one arrives per persistence batch, so an agent's turn brings two,
and each wakes a read-your-writes read. A FastStream subscriber spent 57-64 µs
of CPU per notice (its middlewares, and FastDepends opening an anyio task
group per call), nats-py with a pydantic parse 8.5-12 µs, on the 2-core dev VM
(``tests/bench/runtime.py``; a query worker fed 20,000 notices agreed).

Why the endpoints are a nats micro service on the broker's connection and
not FastStream subscribers (measured against raw nats-py on the same
nats-server; ``tests/bench/runtime.py`` repeats it): a FastStream
request/reply subscriber answers at 0.26-0.31x the throughput with 64
requests in flight and 1.35-1.44x the p50 latency one at a time, while nats
micro runs at 0.87-0.99x; and ``memq status`` reads the micro service's
ping, info and stats.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from faststream.nats import NatsRouter
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.micro.request import Request
from nats.micro.service import Service
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc

from memq.contracts import queries as q
from memq.contracts.errors import (
    Busy,
    Forbidden,
    Internal,
    InvalidRequest,
    MemqError,
    NotCommitted,
    Oversize,
    Unavailable,
    validation_details,
)
from memq.contracts.ids import decode_token
from memq.contracts.notices import CommitNotice, CommittedRanges
from memq.contracts.replies import error_body, ok_body
from memq.contracts.subjects import CHANGED_WILDCARD, PREFIX
from memq.workers import metrics
from memq.workers.memory.tail import MustWait
from memq.workers.query import facts, paging
from memq.workers.query.cache import Entry, QueryCache, build_cache, cache_backend
from memq.workers.query.carried import CarriedTail
from memq.workers.query.consistency import last_acknowledged, read_scope
from memq.workers.query.ops import HANDLERS, OpContext, reads_tail
from memq.workers.query.reply_subjects import ReplyFence, trusted_prefixes
from memq.workers.query.search import Searcher, recall_skipped
from memq.workers.query.slots import RequestSlots, Slot
from memq.workers.query.stream_end import StreamEnd
from memq.workers.query.stream_tail import StreamTail, Tail
from memq.workers.query.stream_unindexed import OwnBacklog, Unindexed, index_behind
from memq.workers.query.windows import WindowCache
from memq.workers.redact import Redactor
from memq.workers.runtime import bus, readiness
from memq.workers.runtime.bus import malformed_notice
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.runtime.component import Component, Live
from memq.workers.runtime.event_streams import event_streams, notice_subject, per_app, stream_of
from memq.workers.settings import Settings, StreamSettings
from memq.workers.sql.engine import is_disconnect, reader

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from memq.workers.runtime.readiness import Check
    from memq.workers.runtime.resources import Resources

log = logging.getLogger("memq.query")

# Reads whose min_seq also waits for the fact worker, once the commit is in.
FACT_READS = frozenset({"facts", "facts.profile"})


@dataclass
class StreamReads:
    """What the reads of one events stream's apps wait on and add (sequences
    are per stream: a read waits on its own app's stream alone)."""

    floor: CommitFloor  # what persistence committed: reads wait on it
    index_floor: CommitFloor  # what indexing indexed: searches wait on it
    tails: StreamTail | None  # the stream's uncommitted tail, with query.read_tail
    unindexed: Unindexed  # a search's memories the index has not reached yet
    end: StreamEnd  # the stream's last sequence: a min_seq beyond it is refused


@dataclass
class QueryLive(Live):
    """What a running query worker reads with: the process's engine, its
    cache and, for each events stream, its floors (:class:`StreamReads`)."""

    engine: AsyncEngine
    reads: AsyncEngine  # the same pool, without a transaction per read (sql.engine.reader)
    cache: QueryCache  # this kind's alone: the query worker is its only user
    streams: dict[str, StreamReads]  # by stream name (event_streams)
    settings: StreamSettings  # which stream holds which app
    # With apps on streams of their own: the shared stream's last sequence,
    # which no longer moves. An app's own stream starts after it.
    shared_end: int = 0

    def of(self, app: str) -> StreamReads:
        """The floors of the stream that holds ``app``'s messages."""
        return self.streams[stream_of(self.settings, app)]

    def from_shared(self, req: q.Request) -> bool:
        """Whether ``req.min_seq`` names a write to the shared stream, made
        before the app had a stream of its own: it is waited for there."""
        seq = req.min_seq
        return seq is not None and seq <= self.shared_end and req.app in self.settings.apps


class QueryWorker(Component[QueryLive]):
    """The query component of a worker process (:mod:`memq.workers.runtime.app`); see
    the module doc. The process hands it the SQL engine, the index and the embedder."""

    KIND = "query"
    DESCRIPTION = "memq sessions, history, context and search"
    NEEDS = frozenset({"sql", "index", "embedder"})

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.searcher = Searcher(settings)  # opens on the first search, on the process's index and embedder
        self.redact = Redactor.for_settings(settings)  # of every error message a reply carries
        self.ctx = OpContext(
            memory=settings.memory,
            apps=settings.query.apps,
            searcher=self.searcher,
            max_instruction_chars=settings.query.max_instruction_chars,
        )
        self.slots = RequestSlots(settings.query.max_inflight, settings.query.app_share, settings.query.app_waiting)
        self.replies = ReplyFence(trusted_prefixes(settings.query.trusted_inboxes, settings.nats.inbox_prefix))
        self._tasks: set[asyncio.Task] = set()
        self._subscriptions: list[Subscription] = []  # the committed notices, persistence's and indexing's (run())
        # Reads wait for one of the pool's kept connections rather than open
        # an overflow one: a commit notice wakes every read waiting on it at
        # once, and the pool closes overflow connections as they come back,
        # so each burst paid a connect (TLS probe, statements prepared again).
        self._sql_slots = asyncio.Semaphore(settings.database.pool_size)

    # --- lifecycle (driven by the process's FastStream hooks) ------------------

    def router(self) -> NatsRouter:
        """Cache invalidation without commit notices, and of the shared tier.
        Every replica must hear every notice for its own (local) tier; the
        shared (Redis) tier needs each notice once, from one replica (a queue
        group). The committed notices are subscribed in start(), with nats-py
        (see the module doc)."""
        router = NatsRouter()
        if not self.settings.query.commit_notices:
            router.subscriber(
                CHANGED_WILDCARD,
                title="memq.v1.changed.>:query-local",
                description="Query worker: drop this replica's cached answers that a commit made stale.",
            )(self.invalidate_local)
        if cache_backend(self.settings) == "redis":
            router.subscriber(
                CHANGED_WILDCARD,
                queue=f"{self.settings.query.queue_group}-cache",
                title="memq.v1.changed.>:query-shared",
                description="Query worker: drop the shared (Redis) cache's stale answers (one replica per notice).",
            )(self.invalidate_shared)
        return router

    async def build(self, nc: NATS, resources: Resources) -> QueryLive:
        s = self.settings
        self.searcher.share(lambda: resources.index, resources.embedder)
        js = nc.jetstream()  # made once here, not per read
        streams = {
            stream: await self._stream_reads(js, stream, resources.engine) for stream in event_streams(s.streams)
        }
        shared_end = 0
        if per_app(s.streams):
            try:
                shared_end = (await js.stream_info(s.streams.events)).state.last_seq
            except NotFoundError:  # a fresh deployment: no history
                pass
        engine = resources.engine
        return QueryLive(nc, js, engine, reader(engine), build_cache(s), streams, s.streams, shared_end)

    async def _stream_reads(self, js: JetStreamContext, stream: str, engine: AsyncEngine) -> StreamReads:
        s = self.settings
        # With commit notices (run()) the ack floor is only the fallback,
        # read at start and every 50 ms while a read waits; without, it is polled.
        poll_from_s = 0.05 if s.query.commit_notices else 0.001
        floor = CommitFloor(js, stream, s.persistence.durable, s.query.floor_refresh_s, poll_from_s=poll_from_s)
        # search's min_seq waits for the indexing worker instead, moved by its
        # notices (run()) with the same fallback
        index_floor = CommitFloor(
            js, stream, s.indexing.durable, s.query.floor_refresh_s, poll_from_s=poll_from_s, done="indexed"
        )
        for which, f in (("commit", floor), ("indexing", index_floor)):
            try:  # a head start only: a read that needs the floor reads it then
                await f.refresh()
            except (NatsError, TimeoutError) as exc:  # JetStream electing a leader (a cluster starting)
                log.warning(
                    "the %s floor of %s could not be read yet (%s); reads will read it",
                    which,
                    stream,
                    type(exc).__name__,
                )
        tails = None
        if s.query.read_tail:
            tails = StreamTail(
                js,
                stream,
                lambda: floor.value,
                max_messages=s.query.tail_max_messages,
                max_bytes=s.streams.max_message_bytes,
            )
        unindexed = Unindexed(
            js,
            stream,
            engine,
            floor,
            scope=s.indexing.storage_scope,
            context=bool(s.indexing.context_turns),
            limit=s.query.search_tail,
            max_bytes=s.streams.max_message_bytes,
        )
        return StreamReads(floor, index_floor, tails, unindexed, StreamEnd(js, stream))

    def checks(self) -> dict[str, Check]:
        return {
            **super().checks(),
            "service": readiness.present(lambda: self.service, "the query service is not registered"),
            "database": readiness.database(lambda: self.live.engine),
        }

    def service_options(self) -> dict:
        return {"queue_group": self.settings.query.queue_group}

    async def run(self) -> None:
        """Hear the notices and the tail before the endpoints register (after
        the invalidation subscribers run, so no answer is cached that a notice
        should have dropped)."""
        live = self.live
        for stream, reads in live.streams.items():
            if self.settings.query.commit_notices:
                # No queue group: every replica keeps its own commit floors.
                for durable, cb in (
                    (self.settings.persistence.durable, self._on_committed(reads)),
                    (self.settings.indexing.durable, self._on_indexed(reads)),
                ):
                    subject = notice_subject(self.settings.streams, durable, stream)
                    self._subscriptions.append(await live.nc.subscribe(subject, cb=cb))
            if reads.tails is not None:
                await bus.patiently(f"the tail of {stream}", reads.tails.start)
        # Pages of session.get, history and context fit this server's max_payload.
        self.ctx = dataclasses.replace(
            self.ctx,
            reply_bytes=paging.reply_bytes(live.nc.max_payload),
            windows=WindowCache(lambda app: live.of(app).floor.value, self.settings.query.window_cache),
        )

    async def serve(self, service: Service) -> None:
        for op in q.OPS:
            await service.add_endpoint(
                name=op.replace(".", "-"), subject=f"{PREFIX}.q.*.{op}", handler=self._handler(op)
            )
        tiers = " + ".join(type(t).__name__ for t in self.live.cache.tiers) or "none"
        log.info("query worker started (%d ops, cache: %s)", len(q.OPS), tiers)

    async def halt(self) -> None:
        if self._tasks:  # reads waiting on the floor still hear the notices
            await asyncio.gather(*self._tasks, return_exceptions=True)
        subscriptions, self._subscriptions = self._subscriptions, []
        for sub in subscriptions:
            with contextlib.suppress(NatsError):  # the connection is already gone
                await sub.unsubscribe()
        await self.searcher.close()
        if self._live is not None:
            for reads in self._live.streams.values():
                if reads.tails is not None:
                    await reads.tails.stop()
            await self._live.cache.close()

    async def reconnected(self) -> None:
        """Notices may have been lost while disconnected: forget the local tier."""
        if self._live is not None:
            self._live.cache.clear_local()

    # --- requests ---------------------------------------------------------------

    def _handler(self, op: str):
        handler = HANDLERS[op]  # a missing handler fails the start, not a request
        # Asked once: the cache and its tiers are fixed from open() on.
        keyed = handler.cached and self.live.cache.enabled

        async def handle(request: Request) -> None:
            # First: a reply the requester could not receive itself is a
            # write somewhere else (workers/query/reply_subjects.py), never answered.
            reply = request._msg.reply  # nats micro's Request has no public accessor
            if not self.replies.allows(request.subject, reply):
                self.replies.refused(op, request.subject, reply)
                return
            started = time.perf_counter()
            try:
                req = self._parse(op, request.subject, request.data)
            except MemqError as exc:  # refusing needs no I/O: answer here
                metrics.QUERY_ERRORS.labels(op, exc.code).inc()
                await request.respond(self._refusal(op, exc))
                metrics.QUERY_SECONDS.labels(op).observe(time.perf_counter() - started)
                return
            key = _request_key(op, req) if keyed and handler.caches(req) else None
            # A hit in this replica's own cache tier needs no I/O either:
            # answering it here saves a task per request on the hottest path.
            if (
                key is not None
                and req.consistency != "any"
                and not self.live.from_shared(req)
                and (body := self._local_hit(req, key)) is not None
            ):
                await request.respond(self._deliverable(op, body))
                metrics.QUERY_SECONDS.labels(op).observe(time.perf_counter() - started)
                return
            # nats-py runs a subscription's callbacks one at a time: answer
            # the rest in a task so that one slow query does not queue
            # others, and take its slot without waiting (workers/query/slots.py).
            try:
                slot = self.slots.admit(req.app, op)
            except Busy as exc:
                metrics.QUERY_ERRORS.labels(op, exc.code).inc()
                await request.respond(self._refusal(op, exc))
                metrics.QUERY_SECONDS.labels(op).observe(time.perf_counter() - started)
                return
            task = asyncio.create_task(self._respond(op, req, key, request, started, slot))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return handle

    def _deliverable(self, op: str, body: bytes) -> bytes:
        """``body``, or a typed error when NATS could not carry it: a reply
        over the server's max_payload is dropped, and the caller would wait.
        Paged answers (session.get, history, context) stay under it; what can
        still be over is what cannot be split: a large state, an inline
        artifact, a page of many sessions, or one event too big for a page."""
        limit = self.nc.max_payload if self.nc is not None else 0
        if limit and len(body) > limit:
            metrics.QUERY_ERRORS.labels(op, Oversize.code).inc()
            return error_body(
                Oversize(
                    f"{op}: the answer is {len(body)} bytes, over the server's max_payload of {limit}; ask for less (limit, page)"
                )
            )
        return body

    def _refusal(self, op: str, exc: MemqError) -> bytes:
        """The reply of a typed error, without what it may say of the server
        (:mod:`memq.workers.redact`): that is logged instead."""
        message = self.redact(exc.message)
        if message == exc.message:
            return error_body(exc)
        log.warning("%s: an error named server details, which its reply leaves out: %s", op, exc.message)
        scrubbed = copy.copy(exc)
        scrubbed.message = message
        return error_body(scrubbed)

    async def _respond(
        self, op: str, req: q.Request, key: str | None, request: Request, started: float, slot: Slot
    ) -> None:
        try:
            await slot.ready()  # queued while the replica's slots are all taken
            body, fill = await self._answer(op, req, key, slot)
            try:
                await request.respond(self._deliverable(op, body))
            except Exception as exc:  # the requester is gone; nothing to tell
                log.debug("reply to %s failed: %s", request.subject, exc)
            metrics.QUERY_SECONDS.labels(op).observe(time.perf_counter() - started)
            if fill is not None:  # after the reply: the requester need not wait on the cache's round trip
                await fill
        finally:
            slot.close()

    async def _answer(
        self, op: str, req: q.Request, key: str | None, slot: Slot
    ) -> tuple[bytes, Awaitable[None] | None]:
        """The reply to a valid request (``key``: its cache key, or None when
        the op or the settings do not cache), and the cache fill of a miss
        still to await (None when nothing is to be cached); ``slot`` is the
        request's, given back while it waits for its ``min_seq``."""
        shared = True  # the cache's shared tier too (below)
        answering_from = time.monotonic()
        try:
            if req.consistency == "any":
                req = await self._with_every_writer(req)
            if self.live.from_shared(req):
                # The app's own stream starts after it: its floors pass the seq
                # at once, whether or not the shared stream's backlog holds it.
                before = self.live.streams[self.settings.streams.events]
                indexing = q.OPS[op].waits_for == "indexing"
                floor = before.index_floor if indexing else before.floor
                await self._wait(op, req, req.wait_ms, floor, slot, before.end)
            if req.min_seq is not None and q.OPS[op].waits_for == "indexing" and not await self.searcher.built():
                # Nothing would move the index floor: the search says why at once.
                req = req.model_copy(update={"min_seq": None})
            if req.min_seq is not None:
                if (tail := self._tail(op, req)) is not None:
                    try:
                        reply = await self._run(op, req, tail=tail)
                        body = ok_body(reply.model_copy(update={"committed_seq": tail.after}))
                        metrics.QUERY_TAIL_READ.inc()
                        return body, None
                    except MustWait as why:  # the commit path answers it
                        log.debug("%s waits for seq %d: %s", op, req.min_seq, why)
                        metrics.QUERY_TAIL_WAIT.inc()
                    finally:
                        tail.close()
                backlog: int | None = None  # the caller's own messages waiting to be indexed, if known
                of = self.live.of(req.app)
                floor = of.index_floor if q.OPS[op].waits_for == "indexing" else of.floor
                # A read that waits for a commit is answered right after it:
                # another replica is unlikely to have stored its answer in the
                # shared tier yet, and the writer's next append makes it
                # stale. It uses this replica's tier alone (two Redis round
                # trips fewer on an agent's turn).
                shared = req.min_seq <= floor.value
                searching = q.OPS[op].waits_for == "indexing"
                waited_from = time.monotonic()
                if searching and not shared and not await self._index_reaches(op, req, slot):
                    try:
                        return ok_body(await self._search_unindexed(req)), None  # type: ignore[arg-type]
                    except MustWait as why:  # the caller's own backlog, or a delete: the index answers it
                        log.debug("%s waits for the index at seq %d: %s", op, req.min_seq, why)
                        backlog = why.waiting if isinstance(why, OwnBacklog) else None
                if not shared:
                    # what is left of wait_ms: a search may have spent some on the index's grace
                    left_ms = max(0, req.wait_ms - round((time.monotonic() - waited_from) * 1000))
                    try:
                        await self._wait(op, req, left_ms, floor, slot)
                    except NotCommitted:
                        if not searching or floor.consumer_missing:
                            raise
                        limit = self.settings.query.search_tail
                        wait_s = req.wait_ms / 1000
                        raise NotCommitted(index_behind(floor, req.min_seq, wait_s, backlog, limit)) from None
            if req.min_seq is not None and op in FACT_READS:
                await self._facts_derived(op, req, slot, answering_from)
            if key is not None:
                return await self._cached(op, req, key, shared=shared)
            return ok_body(await self._run(op, req)), None
        except MemqError as exc:
            metrics.QUERY_ERRORS.labels(op, exc.code).inc()
            return self._refusal(op, exc), None
        except Exception as exc:
            if not _unavailable(exc):
                log.exception("%s failed", op)
                metrics.QUERY_ERRORS.labels(op, Internal.code).inc()
                return error_body(Internal(f"{op} failed; see the worker log")), None
            log.warning("%s failed: %s", op, exc)
            metrics.QUERY_ERRORS.labels(op, Unavailable.code).inc()
            # nats-py's timeouts are asyncio.TimeoutErrors too: the commit
            # floor's consumer info, while JetStream elects a leader.
            what = "JetStream" if isinstance(exc, NatsError) else "the database"
            return error_body(Unavailable(f"{op}: {what} is unavailable, retry later")), None

    async def _facts_derived(self, op: str, req: q.Request, slot: Slot, since: float) -> None:
        """Until the user's facts are derived up to ``req.min_seq`` or what is
        left of ``wait_ms`` runs out, holding no request slot and no
        connection between looks; the reply then says how far behind they are."""
        deadline = since + req.wait_ms / 1000
        pause = 0.02
        async with self.slots.waiting(slot, op):
            while True:
                async with self._sql_slots, self.live.reads.connect() as conn:
                    _, late = await facts.behind(conn, req)
                if not late or time.monotonic() + pause > deadline:
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.25)

    async def _wait(
        self, op: str, req: q.Request, wait_ms: int, floor: CommitFloor, slot: Slot, end: StreamEnd | None = None
    ) -> None:
        """Until ``req.min_seq`` is committed (indexed: ``floor``), holding no request
        slot meanwhile; refused as soon as it is known the stream never held
        it. That is asked beside the wait, so a read whose commit comes
        first pays nothing for it (workers/query/stream_end.py)."""
        seq = req.min_seq or 0
        end = end or self.live.of(req.app).end  # of the app's own stream
        async with self.slots.waiting(slot, op):
            if seq <= end.last:
                await floor.wait_for(seq, wait_ms / 1000)
                return
            committed = asyncio.ensure_future(floor.wait_for(seq, wait_ms / 1000))
            possible = asyncio.ensure_future(end.reaches(seq))
            try:
                await asyncio.wait((committed, possible), return_when=asyncio.FIRST_COMPLETED)
                # A stream that could not be read says nothing: the wait goes on, bounded.
                if not committed.done() and possible.done() and possible.exception() is None and not possible.result():
                    raise InvalidRequest(
                        f"{op}: min_seq {seq} is beyond the events stream's last sequence {end.last}, so it can "
                        "never be committed: pass the seq of a write that was acknowledged (omit it to read "
                        "without waiting)"
                    )
                await committed
            finally:
                committed.cancel()
                if not possible.cancel() and not possible.cancelled():
                    possible.exception()  # retrieved: a failed read only meant waiting on

    async def _with_every_writer(self, req: q.Request) -> q.Request:
        """``req`` waiting also for the newest write any client had
        acknowledged in its scope (:mod:`memq.workers.query.consistency`)."""
        newest = await last_acknowledged(self.live.js, stream_of(self.settings.streams, req.app), read_scope(req))
        if newest <= (req.min_seq or 0):
            return req
        return req.model_copy(update={"min_seq": newest})

    async def _index_reaches(self, op: str, req: q.Request, slot: Slot) -> bool:
        """Whether the index reaches ``req.min_seq`` within ``query.search_grace_ms``.
        An indexer that keeps up does so in milliseconds, and then the index
        answers alone, ranked exactly as ever; only an index really behind (a
        backlog, another app's too) makes a search add the caller's unindexed
        memories, whose keyword scores are estimated (:mod:`memq.workers.memory.unindexed`)."""
        grace_ms = min(req.wait_ms, self.settings.query.search_grace_ms)
        index_floor = self.live.of(req.app).index_floor
        if not req.min_seq or grace_ms <= 0 or index_floor.consumer_missing:
            return False
        try:
            await self._wait(op, req, grace_ms, index_floor, slot)
        except NotCommitted:
            await self.slots.regain(slot)  # the search goes on, with its own unindexed memories
            return False
        return True

    async def _search_unindexed(self, req: q.Search) -> q.SearchResults:
        """``req`` answered now from the index plus the memories of its own
        user scope the index has not reached (:mod:`memq.workers.query.stream_unindexed`);
        raises MustWait when it must wait for the indexer instead."""
        if self.searcher is None:
            raise MustWait("no searcher")
        deadline = time.monotonic() + req.wait_ms / 1000
        try:
            of = self.live.of(req.app)
            tail = await of.unindexed.docs(req, of.index_floor.value, deadline)
        except (NatsError, TimeoutError) as exc:  # JetStream busy or away: the wait says what it can
            raise MustWait(f"the stream could not be read ({type(exc).__name__})") from None
        reply = await self.searcher.search(req, tail=tail)
        metrics.SEARCH_UNINDEXED.inc()
        return reply

    def _tail(self, op: str, req: q.Request) -> Tail | None:
        """The uncommitted tail this read adds instead of waiting for the
        commit, when it can: the writes the caller carries
        (:mod:`memq.workers.query.carried`), else the session's messages held
        from the stream (:mod:`memq.workers.query.stream_tail`, ``query.read_tail``)."""
        if req.min_seq is None or not reads_tail(op, req):
            return None
        of = self.live.of(req.app)
        floor = of.floor.value
        if req.min_seq <= floor:
            return None
        session: str = req.session  # type: ignore[attr-defined]  # reads_tail: a history or context
        carried: q.Carried | None = getattr(req, "carried", None)
        if carried is not None and req.consistency != "any":  # it holds the caller's writes, not others'
            return CarriedTail(req, carried, floor, req.min_seq)  # type: ignore[arg-type]
        if (tails := of.tails) is None:
            return None
        return tails.reader(req.app, req.user, session, after=floor, upto=req.min_seq)

    def _parse(self, op: str, subject: str, data: bytes) -> q.Request:
        try:
            app = decode_token(subject.split(".")[3], "app")
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"request body is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidRequest("request body must be a JSON object")
        if raw.get("v") != q.QUERY_VERSION:
            raise InvalidRequest(f"query version {raw.get('v')!r} is not supported (supported: {q.QUERY_VERSION})")
        try:
            req = q.OPS[op].request.model_validate(raw)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid {op} request: {validation_details(exc)}") from None
        if req.app != app:
            raise Forbidden(f"request for app {req.app!r} sent on a subject of app {app!r}")
        return req

    async def _run(self, op: str, req: q.Request, **extra: Any) -> q.Reply:
        handler = HANDLERS[op]
        if not handler.sql:
            return await handler.run(None, req, self.ctx)
        reads = self.live.reads
        async with self._sql_slots:
            try:
                async with reads.connect() as conn:
                    return await handler.run(conn, req, self.ctx, **extra)
            except sa_exc.DBAPIError as exc:
                if not is_disconnect(exc):
                    raise
            # A pooled connection had died (the database restarted): the pool is
            # recycled now, so once more reaches the database if it is up.
            async with reads.connect() as conn:
                return await handler.run(conn, req, self.ctx, **extra)

    def _local_hit(self, req: q.Request, key: str) -> bytes | None:
        """The answer if this replica's own tier has it, fresh enough for the
        request's min_seq by what is already known of the commit floor; else
        None, and the request takes the full path."""
        cache = self.live.cache
        if cache.local is None or (req.min_seq is not None and req.min_seq > self.live.of(req.app).floor.value):
            return None
        entry = cache.get_local(req.app, req.user, getattr(req, "session", None), key, listing=_lists(req))
        if entry is None or (req.min_seq is not None and entry.as_of < req.min_seq):
            return None
        return entry.body

    async def _cached(
        self, op: str, req: q.Request, key: str, *, shared: bool = True
    ) -> tuple[bytes, Awaitable[None] | None]:
        cache = self.live.cache
        session = getattr(req, "session", None)
        ticket, entry = await cache.get(req.app, req.user, session, key, listing=_lists(req), shared=shared)
        if entry is not None and (req.min_seq is None or entry.as_of >= req.min_seq):
            return entry.body, None
        # read before SQL: the answer holds at least this
        as_of = await self.live.of(req.app).floor.current()
        skipped = recall_skipped.set(False)
        try:
            body = ok_body(await self._run(op, req))
            if recall_skipped.get():  # a context without the memories it should have: not kept
                return body, None
        finally:
            recall_skipped.reset(skipped)
        # The ticket holds the generations read before SQL: a commit after
        # them makes the store a no-op, however late it runs.
        return body, cache.put(ticket, Entry(as_of, body))

    # --- commit notices -------------------------------------------------------------

    def _on_committed(self, reads: StreamReads) -> Callable[[Msg], Awaitable[None]]:
        async def on_committed(msg: Msg) -> None:
            # nats-py runs a subscription's callbacks one at a time, in order.
            if (notice := _notice(msg)) is not None:
                await self.committed(notice, reads)

        return on_committed

    def _on_indexed(self, reads: StreamReads) -> Callable[[Msg], Awaitable[None]]:
        async def on_indexed(msg: Msg) -> None:
            if (notice := _notice(msg)) is not None:
                reads.index_floor.finished(notice.ranges)

        return on_indexed

    async def committed(self, notice: CommittedRanges, reads: StreamReads) -> None:
        """A persistence batch of ``reads``' stream is through: drop what it
        made stale, then move the stream's commit floor."""
        cache = self.live.cache
        for changed in notice.changed:  # first: a read the floor wakes must not see a stale entry
            await cache.invalidate_local(**_scope(changed))
        reads.floor.finished(notice.ranges)

    # The FastStream handlers use the worker's own cache, not a
    # Context("cache") argument: FastDepends solves such a field in a
    # thread per message (anyio.to_thread).

    async def invalidate_local(self, notice: CommitNotice) -> None:
        await self.live.cache.invalidate_local(**_scope(notice))

    async def invalidate_shared(self, notice: CommitNotice) -> None:
        await self.live.cache.invalidate_shared(**_scope(notice))


def _notice(msg: Msg) -> CommittedRanges | None:
    try:
        return CommittedRanges.model_validate_json(msg.data)
    except ValidationError as exc:
        malformed_notice(msg.subject, exc)
        return None


def _request_key(op: str, req: q.Request) -> str:
    key_fields = req.model_dump(mode="json", exclude=set(q.NOT_WHAT_IS_ASKED), exclude_none=True)
    return hashlib.sha1(orjson.dumps([op, key_fields], option=orjson.OPT_SORT_KEYS)).hexdigest()


def _lists(req: q.Request) -> bool:
    """A page of sessions: cached under its listing's counters (see cache.listing_gen_keys)."""
    return isinstance(req, q.SessionsList)


def _scope(notice: CommitNotice) -> dict:
    """What a notice makes stale, as the cache's invalidate_* take it: a
    session's commit or deletion, or a user's deletion, also changes the
    pages of sessions of that user and of the app."""
    return dict(
        app=notice.app,
        user=notice.user,
        session=notice.session,
        app_state=notice.app_state,
        user_state=notice.user_state,
        listing=notice.session is not None or notice.deleted,
    )


# SQLSTATE classes of a database that is away rather than a bad query:
# connection exceptions, and operator intervention (shutting down, or
# "the database system is starting up" right after a restart, which
# SQLAlchemy raises as a plain DBAPIError).
_AWAY_SQLSTATE_CLASSES = ("08", "57")


def _unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means a dependency is away for now (answer
    ``unavailable``), not a bug (answer ``internal``)."""
    if isinstance(exc, (TimeoutError, sa_exc.OperationalError, sa_exc.InterfaceError, OSError, NatsError)):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        return isinstance(sqlstate, str) and sqlstate[:2] in _AWAY_SQLSTATE_CLASSES
    return False
