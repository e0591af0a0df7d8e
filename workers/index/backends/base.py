"""The one Protocol every index backend implements (Weaviate, embedded).

An index has *generations*: complete, independent copies of the index, one
of which is *live* (the one searches and the indexing worker use). A rebuild
fills a fresh generation while the live one keeps serving, then
:meth:`IndexBackend.promote` switches to it atomically and drops the old one
(a Weaviate collection alias; a pointer row in the embedded index). Each
generation records the embedding model and dimension of its vectors, so a
model change is detected and never mixes vectors.

Writes are idempotent: a doc's key is :attr:`memq.workers.memory.recall.Doc.uuid`,
so re-indexing an event overwrites the same object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from memq.workers.memory.recall import Doc, Hit, SearchQuery


@dataclass(frozen=True)
class IndexMeta:
    """What a generation holds: vectors of ``model`` with ``dim`` dimensions,
    and ``min_similarity``, the relevance floor calibrated for that model when
    the generation was created (:mod:`memq.workers.index.embedders.floors`;
    None: a generation older than the recorded floor, which takes its model's)."""

    generation: str
    model: str
    dim: int
    created_at: float = 0.0
    min_similarity: float | None = None


class IndexUnavailable(Exception):
    """The index server cannot be reached or refused a write; retry later."""


class UnknownGeneration(IndexUnavailable):
    """A write or read named a generation that does not exist (any more): it
    was dropped by a switch; re-read the live one."""


@runtime_checkable
class IndexBackend(Protocol):
    name: str

    async def open(self) -> None:
        """Connect (or open files). Raises :class:`IndexUnavailable`."""

    async def close(self) -> None: ...

    # --- generations --------------------------------------------------------

    async def live(self) -> IndexMeta | None:
        """The live generation, or None if nothing was ever promoted."""

    async def generations(self) -> list[IndexMeta]:
        """Every generation that exists (live or being built)."""

    async def create_generation(self, model: str, dim: int, *, min_similarity: float | None = None) -> IndexMeta:
        """A new, empty generation (not live), recording ``min_similarity``."""

    async def promote(self, generation: str) -> None:
        """Atomically make ``generation`` live, then drop the previous one."""

    async def drop_generation(self, generation: str) -> None:
        """Delete a generation that is not live (an abandoned rebuild)."""

    # --- writes (generation None: the live one) -----------------------------

    async def upsert(self, docs: Sequence[Doc], *, generation: str | None = None, rewrite: bool = False) -> None:
        """Insert or overwrite ``docs`` (each has a vector). All or nothing
        is not required, but a failure raises :class:`IndexUnavailable` and a
        retry of the same docs with ``rewrite`` must converge. ``rewrite``:
        an earlier write of these docs failed and may have been applied in
        part (a redelivered or retried batch), so write them from scratch."""

    async def delete_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        before_seq: int | None = None,
        at_seq: int | None = None,
        generation: str | None = None,
    ) -> None:
        """Delete the session's docs (only those with ``seq < before_seq`` if
        given: a session recreated after its delete keeps its new docs; only
        the one with ``seq == at_seq`` if given: a forgotten event's)."""

    async def delete_user(
        self, app: str, user: str, *, before_seq: int | None = None, generation: str | None = None
    ) -> None: ...

    # --- reads ------------------------------------------------------------------

    async def search(self, query: SearchQuery, *, generation: str | None = None) -> list[Hit]:
        """The best ``query.k`` hits within the query's scope and filters,
        best first. ``keyword`` is BM25 over ``search_text``; ``vector`` is
        cosine similarity to ``query.vector``; ``hybrid`` fuses both by
        relative score with ``query.alpha`` on the vector side."""

    async def count(self, *, app: str | None = None, user: str | None = None, generation: str | None = None) -> int: ...

    def export(
        self,
        *,
        app: str | None = None,
        user: str | None = None,
        generation: str | None = None,
    ) -> AsyncIterator[Doc]:
        """Every doc (with its vector) of a generation, optionally of one
        app or user; for comparisons and for copying during a scoped rebuild."""
