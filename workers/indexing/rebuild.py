"""Rebuild the index into a fresh generation, then switch to it atomically.

The live generation keeps serving (and the live workers keep writing to it)
while a new generation is filled from a replay: the event stream from
sequence 1 through an ephemeral consumer, or a read of SQL. Then
:meth:`~memq.workers.index.backends.base.IndexBackend.promote` switches, and
the replay goes on over whatever arrived in the meantime (the *tail*), so no
event that the live worker wrote only to the old generation is missed.
Deletes replay in order with the events they delete, and the persistence
worker has already purged deleted sessions from the stream and SQL, so
deleted data does not come back.

A scoped rebuild (one app or user) copies every doc outside the scope from
the live generation, vectors included, and replays only the scope.

Interrupting a rebuild is safe: a cancelled or failed one drops its unfinished
generation, and one that could not (the process was killed, or stopping cut
the clean-up short) leaves a generation that is never promoted, and that the
next rebuild drops first. Rebuilds hold the ``index-rebuild`` lease, so any
generation that is not live while one holds it was abandoned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from memq.contracts.ids import encode_token
from memq.contracts.subjects import EVENTS_WILDCARD, PREFIX, user_events_filter
from memq.workers.commit_floor import CommitFloor
from memq.workers.index.backends.base import IndexBackend
from memq.workers.indexing.indexer import Indexer
from memq.workers.lease import Lease
from memq.workers.settings import Settings

log = logging.getLogger("memq.indexing")

Progress = Callable[[int, int], None]  # (messages done, messages known so far)
FETCH = 256
COMMIT_WAIT_S = 120.0  # source sql: how long persistence may lag behind the stream
REBUILD_LEASE = "index-rebuild"  # one rebuild at a time, across processes


@dataclass
class RebuildResult:
    generation: str
    model: str
    replayed: int  # messages read from the source
    copied: int  # docs copied from the live generation (scoped rebuild)
    docs: int
    seconds: float


def scope_filter(app: str | None, user: str | None) -> list[str]:
    if user is not None:
        if app is None:
            raise ValueError("--user needs --app")
        return user_events_filter(app, user)
    if app is not None:
        return [f"{PREFIX}.ev.{encode_token(app, 'app')}.>"]
    return [EVENTS_WILDCARD]


def in_scope(doc, app: str | None, user: str | None) -> bool:
    return (app is None or doc.app == app) and (user is None or doc.user == user)


class StreamReplay:
    """An ephemeral, unacked consumer over the scope's subjects from sequence 1."""

    def __init__(self, js: JetStreamContext, stream: str, subjects: list[str], start_seq: int | None = None):
        self.js, self.stream, self.subjects, self.start_seq = js, stream, subjects, start_seq
        self._sub: JetStreamContext.PullSubscription | None = None  # set by open()

    async def open(self) -> int:
        """Create the consumer; returns how many messages it has to deliver now."""
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL if self.start_seq is None else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.start_seq,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=300.0,  # the server removes it if we die
            mem_storage=True,
            filter_subjects=self.subjects if len(self.subjects) > 1 else None,
            filter_subject=self.subjects[0] if len(self.subjects) == 1 else None,
        )
        info = await self.js.add_consumer(self.stream, config)
        self._name = info.name
        self._sub = await self.js.pull_subscribe_bind(consumer=info.name, stream=self.stream)
        return info.num_pending or 0  # a new consumer's info always has it; None only in the type

    async def batches(self) -> AsyncIterator[list]:
        """Batches until nothing is pending at this moment."""
        if self._sub is None:
            raise RuntimeError("StreamReplay.batches() before open()")
        while True:
            try:
                msgs = await self._sub.fetch(FETCH, timeout=1.0)
            except TimeoutError:
                return
            if not msgs:
                return
            yield msgs
            if msgs[-1].metadata.num_pending == 0:
                return

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            try:
                await self.js.delete_consumer(self.stream, self._name)
            except Exception:  # already gone: inactive_threshold cleans up anyway
                pass


async def rebuild(
    settings: Settings,
    js: JetStreamContext,
    indexer: Indexer,
    *,
    source: str = "stream",
    app: str | None = None,
    user: str | None = None,
    engine=None,
    progress: Progress | None = None,
    lease: bool = True,
) -> RebuildResult:
    """Fill a fresh generation with the indexer's embedder, promote it, then
    replay the tail. Raises on failure or cancellation, after dropping the
    unfinished generation.

    :param source: ``stream`` (default) or ``sql`` (``engine`` needed).
    :param app: only this app is replayed (the rest is copied from the live
        generation); default None, everything.
    :param user: only this user of ``app``; default None.
    :param engine: the SQL engine for ``source="sql"``; default None.
    :param progress: called with (messages done, messages known); default None.
    :param lease: take the ``index-rebuild`` lease for the rebuild (default
        True); False when the caller already holds it.
    """
    if not lease:
        return await _rebuild(settings, js, indexer, source, app, user, engine, progress)
    async with Lease(js, REBUILD_LEASE, replicas=settings.streams.replicas):
        return await _rebuild(settings, js, indexer, source, app, user, engine, progress)


async def drop_abandoned(backend: IndexBackend) -> list[str]:
    """Drop every generation that is not live: rebuilds that were interrupted
    before they could clean up. Call only while holding the rebuild lease
    (otherwise it may be another process's rebuild in progress). Returns the
    names dropped."""
    live = await backend.live()
    dropped = []
    for meta in await backend.generations():
        if live is None or meta.generation != live.generation:
            log.warning("dropping index generation %s, left by an interrupted rebuild", meta.generation)
            await backend.drop_generation(meta.generation)
            dropped.append(meta.generation)
    return dropped


async def _rebuild(settings, js, indexer, source, app, user, engine, progress) -> RebuildResult:
    backend: IndexBackend = indexer.backend
    started = time.monotonic()
    scoped = app is not None or user is not None
    live = await backend.live()
    if scoped and live is None:
        raise ValueError("a scoped rebuild needs a live index to copy the rest from; rebuild everything first")
    replay: StreamReplay | None = None
    await drop_abandoned(backend)
    target = await backend.create_generation(indexer.embedder.model, indexer.embedder.dim)
    log.info("rebuilding into %s (%s, source %s)", target.generation, target.model, source)
    subjects = scope_filter(app, user)
    copied = replayed = 0
    docs_before = indexer.totals.docs
    try:
        if scoped:
            copied = await _copy_outside_scope(backend, target.generation, app, user, live, indexer)
        if source == "sql":
            if engine is None:
                raise ValueError("source sql needs a database engine")
            # SQL holds everything up to the stream's end once the persistence
            # floor reaches it; the tail replays the stream after that point.
            end = (await js.stream_info(settings.streams.events)).state.last_seq
            await CommitFloor(js, settings.streams.events, settings.persistence.durable).wait_for(end, COMMIT_WAIT_S)
            replay = StreamReplay(js, settings.streams.events, subjects, start_seq=end + 1)
            await replay.open()
            replayed = await _replay_sql(engine, indexer, target.generation, app, user, progress)
        else:
            replay = StreamReplay(js, settings.streams.events, subjects)
            total = await replay.open()
            async for batch in replay.batches():
                await indexer.apply(indexer.decode(batch), generation=target.generation)
                replayed += len(batch)
                if progress:
                    progress(replayed, max(total, replayed))
        await backend.promote(target.generation)
        # Tail: what arrived while we replayed went to the old generation only.
        async for batch in replay.batches():
            await indexer.apply(indexer.decode(batch), generation=target.generation)
            replayed += len(batch)
    except BaseException:
        await _abandon(backend, replay, target.generation)
        raise
    await replay.close()
    return RebuildResult(
        generation=target.generation,
        model=target.model,
        replayed=replayed,
        copied=copied,
        docs=indexer.totals.docs - docs_before,
        seconds=time.monotonic() - started,
    )


async def _abandon(backend: IndexBackend, replay: StreamReplay | None, generation: str) -> None:
    """Clean up after a failed or cancelled rebuild. A clean-up error is
    logged, never raised: it must not replace the original exception (a
    CancelledError turned into IndexUnavailable would make the worker retry
    instead of stop); what is left is dropped by the next rebuild."""
    try:
        if replay is not None:
            await replay.close()
        live = await backend.live()
        if live is None or live.generation != generation:
            await backend.drop_generation(generation)
    except Exception as exc:
        log.warning(
            "could not drop the unfinished index generation %s (%s); the next rebuild drops it", generation, exc
        )


async def _copy_outside_scope(backend, generation, app, user, live, indexer) -> int:
    if (live.model, live.dim) != (indexer.embedder.model, indexer.embedder.dim):
        raise ValueError(
            f"the live index holds {live.model} vectors and the embedder is {indexer.embedder.model}: "
            "a scoped rebuild cannot mix them; rebuild everything"
        )
    copied, batch = 0, []
    async for doc in backend.export():
        if in_scope(doc, app, user):
            continue
        batch.append(doc)
        if len(batch) >= FETCH:
            await backend.upsert(batch, generation=generation)
            copied, batch = copied + len(batch), []
    if batch:
        await backend.upsert(batch, generation=generation)
        copied += len(batch)
    return copied


async def _replay_sql(engine, indexer: Indexer, generation: str, app, user, progress) -> int:
    from memq.workers.sql import reads  # only the sql source needs SQL

    done = 0
    total = await reads.count_indexable(engine, app=app, user=user)
    async for rows in reads.indexable_messages(engine, app=app, user=user, page=FETCH):
        await indexer.apply(rows, generation=generation)
        done += len(rows)
        if progress:
            progress(done, max(total, done))
    return done
