"""The query worker's Searcher borrows the process's index and embedder
(Searcher.share): it opens neither of its own and closes neither."""

from __future__ import annotations

from memq.workers.query.search import Searcher
from memq.workers.settings import Settings


class Closable:
    def __init__(self) -> None:
        self.opened = self.closed = 0

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        self.closed += 1


async def test_a_shared_index_and_embedder_are_used_and_left_open(tmp_path):
    backend, embedder = Closable(), Closable()
    asked: list[str] = []

    def index() -> Closable:
        asked.append("index")
        return backend

    async def model() -> Closable:
        asked.append("embedder")
        return embedder

    searcher = Searcher(Settings(data_dir=tmp_path))
    searcher.share(index, model)  # type: ignore[arg-type]
    assert asked == []  # nothing until the first search
    await searcher._open()
    await searcher._open()
    assert searcher.backend is backend and searcher.embedder is embedder
    assert asked == ["index", "embedder"] and backend.opened == 1  # opening a shared index is idempotent
    await searcher.close()
    assert backend.closed == 0 and embedder.closed == 0  # their owner, the process, closes them


async def test_what_a_test_hands_the_searcher_is_still_closed_by_it(tmp_path):
    backend, embedder = Closable(), Closable()
    searcher = Searcher(Settings(data_dir=tmp_path), backend=backend, embedder=embedder)  # type: ignore[arg-type]
    searcher.share(lambda: Closable(), None)  # type: ignore[arg-type]
    await searcher._open()
    assert searcher.backend is backend
    await searcher.close()
    assert backend.closed == 1 and embedder.closed == 1
