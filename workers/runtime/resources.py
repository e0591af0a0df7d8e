"""The dependencies a process's components share (:class:`Resources`) and
what a component may ask for (:data:`Need`).

A module of its own: the process (:mod:`memq.workers.runtime.app`) makes
the resources and every component (:mod:`memq.workers.runtime.component`)
is handed them, so both import this and it imports neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from memq.workers.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from memq.workers.index.backends.base import IndexBackend
    from memq.workers.index.embedders.base import Embedder

log = logging.getLogger("memq.app")

# What a kind may ask the process for (Resources makes each once per process).
Need = Literal["sql", "index", "embedder"]


class Resources:
    """The dependencies a process's components share, made by what the
    components declare (``Component.NEEDS``), each on first use, and closed
    once when the process stops: one SQL engine (its pool sized for every
    component that needs SQL), one index and one embedder. Asking for one
    that no component declared is a bug, and says so.

    An ``index`` or ``embedder`` handed in is used instead of the one the
    settings name (a test's, shared by its workers or slowed down) and
    closed the same way."""

    def __init__(
        self,
        settings: Settings,
        needs: Counter[Need] | None = None,
        *,
        index: IndexBackend | None = None,
        embedder: Embedder | None = None,
    ):
        self.settings = settings
        self.needs: Counter[Need] = needs if needs is not None else Counter(("sql", "index", "embedder"))
        self._engine: AsyncEngine | None = None
        self._index: IndexBackend | None = index
        self._embedder: Embedder | None = embedder
        self._embedding = asyncio.Lock()  # the model loads once, however many ask at once

    def _declared(self, need: Need) -> None:
        if not self.needs[need]:
            raise RuntimeError(f"no component of this process declared that it needs {need!r} (Component.NEEDS)")

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            self._declared("sql")
            from memq.workers.sql.engine import create_engine

            db = self.settings.database
            self._engine = create_engine(
                self.settings.database_url(), pool_size=db.pool_size * self.needs["sql"], echo=db.echo
            )
        return self._engine

    @property
    def index(self) -> IndexBackend:
        """The index backend, not opened yet (opening is idempotent: its user opens it)."""
        if self._index is None:
            self._declared("index")
            from memq.workers.index.backends import open_backend

            self._index = open_backend(self.settings)
        return self._index

    async def embedder(self) -> Embedder:
        """The embedder the settings name, loaded on first call."""
        async with self._embedding:
            if self._embedder is None:
                self._declared("embedder")
                from memq.workers.index.embedders import open_embedder

                self._embedder = await open_embedder(self.settings.indexing)
            return self._embedder

    async def close(self) -> None:
        embedder, index, engine = self._embedder, self._index, self._engine
        self._embedder = self._index = self._engine = None
        closers: list[tuple[str, Callable[[], Awaitable[None]] | None]] = [
            ("embedder", embedder.close if embedder is not None else None),
            ("index", index.close if index is not None else None),
            ("engine", engine.dispose if engine is not None else None),
        ]
        for what, close in closers:
            if close is None:  # never made
                continue
            try:
                await close()
            except Exception:  # one failure must not leave the others open
                log.exception("closing the %s failed", what)
