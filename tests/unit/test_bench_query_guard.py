"""The query benchmark's guard (tests/bench/query.py): a row is checked
against the query workers' own counters, so a "hit" row whose requests were
not served from the cache (a context whose recall was skipped is never kept)
fails the run instead of publishing misses as hits."""

from __future__ import annotations

import pytest
from bench.query import Counters, Load, NotMeasured, Row, check_counted, parse_counters
from prometheus_client import generate_latest

from memq.workers import metrics


def row(op: str, cache: str, c64: int = 90, c1: int = 10) -> Row:
    return Row(
        replicas=1,
        op=op,
        session="10",
        cache=cache,
        c64=Load(concurrency=64, seconds=1, requests=c64),
        c1=Load(concurrency=1, seconds=1, requests=c1),
    )


def test_the_counters_are_read_from_the_workers_own_exposition():
    before = parse_counters(generate_latest(metrics.REGISTRY).decode())
    metrics.CACHE_HIT.inc(3)
    metrics.CACHE_MISS.inc()
    metrics.RECALL_SKIPPED.labels("unavailable").inc(2)
    metrics.RECALL_SKIPPED.labels("timeout").inc()

    assert parse_counters(generate_latest(metrics.REGISTRY).decode()) - before == Counters(3, 1, 3)


@pytest.mark.parametrize("op", ["history", "context"])
def test_a_row_served_as_labelled_passes(op):
    check_counted(row(op, "hit"), Counters(hits=100))
    check_counted(row(op, "hit"), Counters(hits=101))  # a request that timed out (an error) was still answered
    check_counted(row(op, "miss"), Counters(misses=100))


def test_a_context_hit_row_whose_recall_was_skipped_fails():
    # What the benchmark timed without an index: every "hit" a miss, each recall skipped.
    with pytest.raises(NotMeasured, match="100 requests answered; the workers counted 0 cache hits, 100 misses"):
        check_counted(row("context", "hit"), Counters(misses=100, recall_skipped=100))


@pytest.mark.parametrize(
    ("cache", "counted"),
    [
        ("hit", Counters(hits=99, misses=1)),  # one missed
        ("hit", Counters(hits=50)),  # answered but not counted as hits
        ("miss", Counters(hits=1, misses=99)),  # a "miss" row that hit
        ("miss", Counters(misses=99)),
    ],
)
def test_a_row_not_served_as_labelled_fails(cache, counted):
    with pytest.raises(NotMeasured, match="not all"):
        check_counted(row("history", cache), counted)


def test_a_context_miss_without_its_recall_fails():
    with pytest.raises(NotMeasured, match="recalls were skipped"):
        check_counted(row("context", "miss"), Counters(misses=100, recall_skipped=1))
