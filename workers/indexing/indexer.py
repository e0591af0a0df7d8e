"""Apply stream messages to an index generation: embed, upsert, delete.

Shared by the live indexing worker and by rebuilds, so a rebuilt index is
built by exactly the code that built the live one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from memq.contracts.codec import decode_from_subject
from memq.contracts.errors import MemqError
from memq.contracts.ids import scope_key
from memq.contracts.schemas import EventAppended, EventForgotten, SessionDeleted, StreamMessage, UserDeleted
from memq.workers.index.backends.base import IndexBackend
from memq.workers.index.embedders.base import Embedder
from memq.workers.memory.recall import SUMMARY_ROLE, Doc, StorageScope, Turn, doc_for, turn_of

if TYPE_CHECKING:
    from memq.workers.index.previous import PreviousTurns

log = logging.getLogger("memq.indexing")


@dataclass
class Applied:
    docs: int = 0
    deletes: int = 0
    skipped: int = 0  # undecodable: the persistence worker dead-letters those
    embed_s: float = 0.0
    upsert_s: float = 0.0
    last_seq: int = 0


def redelivered(msgs: Sequence[Msg]) -> bool:
    """Whether a batch holds a message delivered before: its earlier try
    failed or timed out, maybe after writing part of it."""
    return any(m.metadata.num_delivered > 1 for m in msgs)


@dataclass
class Indexer:
    backend: IndexBackend
    embedder: Embedder
    scope: StorageScope = "all"
    max_message_bytes: int = 1024 * 1024
    previous: PreviousTurns | None = None  # each doc's previous turn; None: no context
    totals: Applied = field(default_factory=Applied)

    def decode(self, msgs: Sequence[Msg]) -> list[tuple[int, StreamMessage]]:
        out: list[tuple[int, StreamMessage]] = []
        for msg in msgs:
            try:
                out.append(
                    (
                        msg.metadata.sequence.stream,
                        decode_from_subject(msg.subject, msg.data, max_bytes=self.max_message_bytes),
                    )
                )
            except MemqError as exc:
                # Not dead-lettered here as well: one DLQ entry per bad message.
                log.debug("skipping seq %s: %s", msg.metadata.sequence.stream, exc)
                self.totals.skipped += 1
            except Exception:  # a decoder bug: the persistence worker dead-letters it as `internal`
                log.exception("decoding seq %s failed unexpectedly; skipped", msg.metadata.sequence.stream)
                self.totals.skipped += 1
        return out

    async def apply(
        self, items: Sequence[tuple[int, StreamMessage]], *, generation: str | None = None, rewrite: bool = False
    ) -> Applied:
        """Apply decoded ``(seq, message)`` pairs in order. Deletes cut the
        batch: docs before a delete are written first, so the delete (bounded
        by its own seq) removes them and spares anything newer. ``rewrite``:
        an earlier try of these messages failed, maybe half-applied (see
        :meth:`IndexBackend.upsert`)."""
        done = Applied()
        pending: list[Doc] = []
        last = await self._previous_turns(items)
        owners: dict[str, tuple[str, str]] = {}
        for seq, message in items:
            key = _session_key(message)
            if key is not None:
                owners[key] = (message.app, message.user)
            if isinstance(message, EventForgotten):
                if message.seq < seq:  # as the persistence worker: a forget names an earlier message
                    await self._write(pending, generation, done, rewrite)  # the event may be in this batch
                    pending = []
                    await self._forget(seq, message, last, generation)
                    done.deletes += 1
            elif isinstance(message, (SessionDeleted, UserDeleted)):
                await self._write(pending, generation, done, rewrite)
                pending = []
                # a session recreated after its delete starts without context
                if isinstance(message, SessionDeleted):
                    last.pop(scope_key(message.app, message.user, message.session), None)
                    await self.backend.delete_session(
                        message.app, message.user, message.session, before_seq=seq, generation=generation
                    )
                else:
                    for k, owner in owners.items():
                        if owner == (message.app, message.user):
                            last.pop(k, None)
                    await self.backend.delete_user(message.app, message.user, before_seq=seq, generation=generation)
                done.deletes += 1
            # docs come only from a session's events and checkpoints: a message without a session has none
            elif key is not None and (doc := doc_for(seq, message, self.scope, last.get(key))) is not None:
                pending.append(doc)
                if self.previous is not None and doc.role != SUMMARY_ROLE:
                    last[key] = turn_of(doc)
            done.last_seq = max(done.last_seq, seq)
        await self._write(pending, generation, done, rewrite)
        for name in ("docs", "deletes", "embed_s", "upsert_s"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(done, name))
        self.totals.last_seq = max(self.totals.last_seq, done.last_seq)
        return done

    async def _forget(self, seq: int, message: EventForgotten, last: dict[str, Turn], generation: str | None) -> None:
        """Delete the forgotten event's doc; with context on, also take its
        text out of the next turn's doc (whose context it was) and of the
        context the rest of this batch gets, reading SQL once the forget is
        committed there."""
        await self.backend.delete_session(
            message.app, message.user, message.session, at_seq=message.seq, generation=generation
        )
        if self.previous is None:
            return
        key = scope_key(message.app, message.user, message.session)
        before = await self.previous.before({key: (seq, message)})  # waits for the forget's commit
        if key in before:
            last[key] = before[key]
        else:
            last.pop(key, None)
        if (found := await self.previous.next_turn(message, seq)) is not None:
            next_seq, event = found
            previous = (await self.previous.before({key: found})).get(key)
            if (doc := doc_for(next_seq, event, self.scope, previous)) is not None:
                await self._write([doc], generation, Applied())

    async def _previous_turns(self, items: Sequence[tuple[int, StreamMessage]]) -> dict[str, Turn]:
        """The turn before the first event of each session in the batch; the
        batch itself provides the rest, in order."""
        if self.previous is None:
            return {}
        firsts: dict[str, tuple[int, EventAppended]] = {}
        for seq, message in items:
            if isinstance(message, EventAppended):
                firsts.setdefault(scope_key(message.app, message.user, message.session), (seq, message))
        return await self.previous.before(firsts)

    async def _write(self, docs: list[Doc], generation: str | None, done: Applied, rewrite: bool = False) -> None:
        if not docs:
            return
        t0 = time.perf_counter()
        if self.embedder.dim:
            vectors = await self.embedder.embed([d.search_text for d in docs])
            docs = [d.with_vector(v) for d, v in zip(docs, vectors, strict=True)]  # one vector per text, or fail
        # else a keyword-only index (dim 0): docs go in without vectors
        t1 = time.perf_counter()
        await self.backend.upsert(docs, generation=generation, rewrite=rewrite)
        done.embed_s += t1 - t0
        done.upsert_s += time.perf_counter() - t1
        done.docs += len(docs)


def _session_key(message: StreamMessage) -> str | None:
    """The key of the session a message belongs to; None for a user delete
    and for a state set without a session."""
    session = None if isinstance(message, UserDeleted) else message.session
    return scope_key(message.app, message.user, session) if session else None


def make_indexer(settings, backend: IndexBackend, embedder: Embedder, js, engine=None) -> Indexer:
    """The indexer as the settings want it: with the previous turn as
    context (reading SQL; ``engine`` default: one for the settings' database)
    unless ``indexing.context_turns`` is 0."""
    previous = None
    if settings.indexing.context_turns:
        from memq.workers.index.previous import PreviousTurns
        from memq.workers.runtime.commit_floor import CommitFloor
        from memq.workers.runtime.event_streams import event_streams, stream_of
        from memq.workers.sql.engine import create_engine

        engine = engine or create_engine(settings.database_url(), pool_size=settings.database.pool_size)
        floors = {
            stream: CommitFloor(js, stream, settings.persistence.durable) for stream in event_streams(settings.streams)
        }
        previous = PreviousTurns(
            engine, lambda app: floors[stream_of(settings.streams, app)], settings.indexing.storage_scope
        )
    return Indexer(
        backend,
        embedder,
        settings.indexing.storage_scope,
        max_message_bytes=settings.streams.max_message_bytes,
        previous=previous,
    )
