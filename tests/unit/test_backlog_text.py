"""What a tenant and an operator are told about a backlog: the search error
that names the caller's own backlog with an ETA, and `memq status`'s rates."""

from __future__ import annotations

from memq.workers.query.stream_unindexed import index_behind
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.status import ConsumerStatus, backlog_text, duration, with_rates


def floor_at(value: int, moved: list[tuple[float, int]]) -> CommitFloor:
    floor = CommitFloor(None, "S", "memq-indexing", done="indexed")  # type: ignore[arg-type]
    floor._floor.value = value
    floor._moves.extend(moved)
    return floor


def test_rate_is_how_far_the_floor_moved_lately():
    floor = floor_at(1_300, [(100.0, 300)])
    assert floor.rate(now=110.0) == 100.0  # 1,000 in 10 s
    assert floor.rate(now=200.0) == 0.0  # nothing within the window: no rate, no ETA


def test_error_names_the_callers_own_backlog_with_an_eta_and_what_to_do(monkeypatch):
    floor = floor_at(6_339, [(0.0, 339)])
    monkeypatch.setattr("time.monotonic", lambda: 20.0)  # 6,000 in 20 s: 300/s
    text = index_behind(floor, 20_021, 2.0, own=13_000, limit=64)
    assert "sequence 20021 is not indexed yet after 2.0s" in text
    assert "13682 messages behind, about 46s at 300/s" in text
    assert "13000 of them are this user's own" in text and "query.search_tail = 64" in text
    assert text.endswith("search what is indexed now without min_seq (min_seq=0; `memq search --min-seq 0`)")
    stuck = index_behind(floor_at(10, []), 20, 2.0, own=None, limit=64)
    assert "has not moved lately" in stuck and "this user's own" not in stuck


def test_status_rates_and_etas():
    before = [
        ConsumerStatus("memq-indexing", 20_000, 64, 0, 1_000),
        ConsumerStatus("memq-persistence", 0, 0, 0, 21_000),
    ]
    after = [ConsumerStatus("memq-indexing", 19_436, 64, 0, 1_500), ConsumerStatus("memq-persistence", 0, 0, 0, 21_000)]
    rated = with_rates(before, after, 2.0)
    assert rated[0].rate == 250.0 and rated[0].backlog == 19_500 and rated[0].eta_s == 78.0
    assert rated[1].eta_s is None  # nothing waits
    assert backlog_text(rated) == "memq-indexing 19500 waiting, about 78s at 250/s"
    stuck = with_rates(after, after, 2.0)
    assert backlog_text(stuck) == "memq-indexing 19500 waiting, no ack seen while sampled (replicas ack whole batches)"
    assert [duration(s) for s in (0.2, 89, 600, 9000)] == ["1s", "89s", "10 min", "2.5 h"]
