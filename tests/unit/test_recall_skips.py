"""Recall when the index is down or slow: the context goes on without it,
each skip is counted, and the log says so once a minute, not once a context."""

from __future__ import annotations

import asyncio
import logging

import pytest

from memq.workers import metrics
from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.query import search
from memq.workers.query.search import Searcher
from memq.workers.settings import Settings


class DownIndex:
    name = "down"

    async def live(self):
        raise IndexUnavailable("connection refused")


class SlowIndex:
    name = "slow"

    async def live(self):
        await asyncio.sleep(10)


class Embedder:
    model, dim = "fake", 3


def searcher(backend) -> Searcher:
    s = Settings()
    s.recall = type(s.recall).model_validate({**s.recall.model_dump(), "timeout_s": 0.01})
    return Searcher(s, backend=backend, embedder=Embedder())


def skipped(reason: str) -> float:
    return metrics.RECALL_SKIPPED.labels(reason)._value.get()


def recall_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("recall skipped")]


async def test_a_down_index_is_counted_every_time_and_logged_once_a_minute(caplog, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(search.time, "monotonic", lambda: clock[0])
    s = searcher(DownIndex())
    before = skipped("unavailable")
    with caplog.at_level(logging.WARNING, logger="memq.query"):
        for _ in range(5):
            assert await s.recall("app", "alice", "where do I work?", k=5) == []
        assert skipped("unavailable") == before + 5
        lines = recall_lines(caplog)
        assert len(lines) == 1 and "connection refused" in lines[0]

        clock[0] += search.SKIPPED_LOG_EVERY_S - 1
        await s.recall("app", "alice", "where do I work?", k=5)
        assert len(recall_lines(caplog)) == 1

        clock[0] += 1
        await s.recall("app", "alice", "where do I work?", k=5)
        lines = recall_lines(caplog)
        # the second line counts what the first did not say: four silent skips and itself
        assert len(lines) == 2 and "(6 in the last 60s)" in lines[1]


async def test_a_slow_index_is_skipped_as_a_timeout(caplog):
    s = searcher(SlowIndex())
    before = skipped("timeout")
    with caplog.at_level(logging.WARNING, logger="memq.query"):
        assert await s.recall("app", "alice", "where do I work?", k=5) == []
    assert skipped("timeout") == before + 1
    assert recall_lines(caplog) == ["recall skipped: no answer within 0.01s"]


@pytest.mark.parametrize("k, text", [(0, "hello"), (5, "  ")])
async def test_nothing_to_recall_is_not_a_skip(k, text):
    before = skipped("unavailable")
    assert await searcher(DownIndex()).recall("app", "alice", text, k=k) == []
    assert skipped("unavailable") == before
