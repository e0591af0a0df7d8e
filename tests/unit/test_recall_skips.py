"""Recall when the index is down or slow (a Weaviate URL with nothing
behind it, or a socket that never answers): the context goes on without it,
each skip is counted, and the log says so once a minute, not once a context."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Iterator

import pytest

from memq.workers import metrics
from memq.workers.query import search
from memq.workers.query.search import Searcher
from memq.workers.settings import Settings


@pytest.fixture
def refused_port() -> int:
    """A loopback port nothing listens on: a Weaviate that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts and never answers: a Weaviate that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def searcher(port: int, tmp_path, timeout_s: float = 5.0) -> Searcher:
    s = Settings(data_dir=tmp_path, indexing={"weaviate": {"url": f"http://127.0.0.1:{port}"}})
    s.recall = type(s.recall).model_validate({**s.recall.model_dump(), "timeout_s": timeout_s})
    return Searcher(s)


def skipped(reason: str) -> float:
    return metrics.RECALL_SKIPPED.labels(reason)._value.get()


def recall_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("recall skipped")]


async def test_a_down_index_is_counted_every_time_and_logged_once_a_while(caplog, monkeypatch, refused_port, tmp_path):
    monkeypatch.setattr(search, "SKIPPED_LOG_EVERY_S", 3.0)  # a minute in production
    s = searcher(refused_port, tmp_path)
    before = skipped("unavailable")
    try:
        with caplog.at_level(logging.WARNING, logger="memq.query"):
            for _ in range(5):
                assert await s.recall("app", "alice", "where do I work?", k=5) == []
            assert skipped("unavailable") == before + 5
            lines = recall_lines(caplog)
            assert len(lines) == 1 and "the index is unavailable" in lines[0] and str(refused_port) in lines[0]

            await s.recall("app", "alice", "where do I work?", k=5)  # still within the interval
            assert len(recall_lines(caplog)) == 1

            await asyncio.sleep(3.1)
            await s.recall("app", "alice", "where do I work?", k=5)
            lines = recall_lines(caplog)
            # the second line counts what the first did not say: five silent skips and itself
            assert len(lines) == 2 and re.search(r"\(6 in the last [34]s\)$", lines[1]), lines
    finally:
        await s.close()


async def test_a_slow_index_is_skipped_as_a_timeout(caplog, silent_port, tmp_path):
    s = searcher(silent_port, tmp_path, timeout_s=0.2)
    before = skipped("timeout")
    try:
        with caplog.at_level(logging.WARNING, logger="memq.query"):
            assert await s.recall("app", "alice", "where do I work?", k=5) == []
    finally:
        await s.close()
    assert skipped("timeout") == before + 1
    assert recall_lines(caplog) == ["recall skipped: no answer within 0.2s"]


@pytest.mark.parametrize("k, text", [(0, "hello"), (5, "  ")])
async def test_nothing_to_recall_is_not_a_skip(k, text, refused_port, tmp_path):
    before = skipped("unavailable")
    assert await searcher(refused_port, tmp_path).recall("app", "alice", text, k=k) == []
    assert skipped("unavailable") == before
