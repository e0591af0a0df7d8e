"""Apply stream messages to an index generation: embed, upsert, delete.

Shared by the live indexing worker and by rebuilds, so a rebuilt index is
built by exactly the code that built the live one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from memq.contracts.codec import decode_from_subject
from memq.contracts.errors import MemqError
from memq.workers.index.backends.base import IndexBackend
from memq.workers.index.embedders.base import Embedder
from memq.contracts.ids import scope_key
from memq.workers.memory.recall import SUMMARY_ROLE, Doc, StorageScope, Turn, doc_for, turn_of

log = logging.getLogger("memq.indexing")


@dataclass
class Applied:
    docs: int = 0
    deletes: int = 0
    skipped: int = 0  # undecodable: the persistence worker dead-letters those
    embed_s: float = 0.0
    upsert_s: float = 0.0
    last_seq: int = 0


@dataclass
class Indexer:
    backend: IndexBackend
    embedder: Embedder
    scope: StorageScope = "all"
    max_message_bytes: int = 1024 * 1024
    previous: Any = None  # memq.workers.indexing.previous.PreviousTurns: each doc's previous turn; None: no context
    totals: Applied = field(default_factory=Applied)

    def decode(self, msgs: Sequence[Msg]) -> list[tuple[int, object]]:
        out = []
        for msg in msgs:
            try:
                out.append((msg.metadata.sequence.stream, decode_from_subject(msg.subject, msg.data, max_bytes=self.max_message_bytes)))
            except MemqError as exc:
                # Not dead-lettered here as well: one DLQ entry per bad message.
                log.debug("skipping seq %s: %s", msg.metadata.sequence.stream, exc)
                self.totals.skipped += 1
            except Exception:  # a decoder bug: the persistence worker dead-letters it as `internal`
                log.exception("decoding seq %s failed unexpectedly; skipped", msg.metadata.sequence.stream)
                self.totals.skipped += 1
        return out

    async def apply(self, items: Sequence[tuple[int, object]], *, generation: str | None = None) -> Applied:
        """Apply decoded ``(seq, message)`` pairs in order. Deletes cut the
        batch: docs before a delete are written first, so the delete (bounded
        by its own seq) removes them and spares anything newer."""
        done = Applied()
        pending: list[Doc] = []
        last = await self._previous_turns(items)
        owners: dict[str, tuple[str, str]] = {}
        for seq, message in items:
            kind = getattr(message, "kind", None)
            key = scope_key(message.app, message.user, message.session) if getattr(message, "session", None) else None
            if key is not None:
                owners[key] = (message.app, message.user)
            if kind in ("session.delete", "user.delete"):
                await self._write(pending, generation, done)
                pending = []
                # a session recreated after its delete starts without context
                gone = [k for k, (app, user) in owners.items() if (app, user) == (message.app, message.user)]
                for k in [key] if kind == "session.delete" else gone:
                    last.pop(k, None)
                if kind == "session.delete":
                    await self.backend.delete_session(
                        message.app, message.user, message.session, before_seq=seq, generation=generation
                    )
                else:
                    await self.backend.delete_user(message.app, message.user, before_seq=seq, generation=generation)
                done.deletes += 1
            elif (doc := doc_for(seq, message, self.scope, last.get(key))) is not None:
                pending.append(doc)
                if self.previous is not None and doc.role != SUMMARY_ROLE:
                    last[key] = turn_of(doc)
            done.last_seq = max(done.last_seq, seq)
        await self._write(pending, generation, done)
        for name in ("docs", "deletes", "embed_s", "upsert_s"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(done, name))
        self.totals.last_seq = max(self.totals.last_seq, done.last_seq)
        return done

    async def _previous_turns(self, items) -> dict[str, Turn]:
        """The turn before the first event of each session in the batch; the
        batch itself provides the rest, in order."""
        if self.previous is None:
            return {}
        firsts: dict[str, tuple[int, Any]] = {}
        for seq, message in items:
            if getattr(message, "kind", None) == "event":
                firsts.setdefault(scope_key(message.app, message.user, message.session), (seq, message))
        return await self.previous.before(firsts)

    async def _write(self, docs: list[Doc], generation: str | None, done: Applied) -> None:
        if not docs:
            return
        t0 = time.perf_counter()
        if self.embedder.dim:
            docs = [d.with_vector(v) for d, v in zip(docs, await self.embedder.embed([d.search_text for d in docs]))]
        # else a keyword-only index (dim 0): docs go in without vectors
        t1 = time.perf_counter()
        await self.backend.upsert(docs, generation=generation)
        done.embed_s += t1 - t0
        done.upsert_s += time.perf_counter() - t1
        done.docs += len(docs)


def make_indexer(settings, backend: IndexBackend, embedder: Embedder, js, engine=None) -> Indexer:
    """The indexer as the settings want it: with the previous turn as
    context (reading SQL; ``engine`` default: one for the settings' database)
    unless ``indexing.context_turns`` is 0."""
    previous = None
    if settings.indexing.context_turns:
        from memq.workers.indexing.previous import PreviousTurns
        from memq.workers.commit_floor import CommitFloor
        from memq.workers.sql.engine import create_engine

        engine = engine or create_engine(settings.database_url(), pool_size=settings.database.pool_size)
        floor = CommitFloor(js, settings.streams.events, settings.persistence.durable)
        previous = PreviousTurns(engine, floor, settings.indexing.storage_scope)
    return Indexer(
        backend, embedder, settings.indexing.storage_scope,
        max_message_bytes=settings.streams.max_message_bytes, previous=previous,
    )  # fmt: skip
