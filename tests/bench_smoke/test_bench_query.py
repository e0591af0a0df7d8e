"""tests/bench/query.py runs at its --smoke size against real worker
processes (PostgreSQL, Redis, an embedded index) and reports every row: each
op, session and cache state, none with an error, each served as its name says
by the workers' own counters (the bench's guard), the seeded sessions as the
replies say."""

from __future__ import annotations

import itertools

import pytest
from bench import query
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(240)

EVENTS, SESSIONS = query.SMOKE.large_events, query.SMOKE.list_sessions


def test_the_query_benchmark_answers_every_row_without_an_error(tmp_path):
    # Two workers as well: a hit row must be hits on each (the fill reaches both).
    result = run_bench("query", "--smoke", "--replicas", "1,2", out=tmp_path / "query.json")

    assert (
        result["mode"] == "smoke"
        and result["config"]["large_events"] == EVENTS
        and result["config"]["replicas"] == [1, 2]
    )
    assert result["sanity"]["history/s10"]["events"] == 10
    assert result["sanity"]["history/s10k"]["summary"] is True  # the large session starts at its checkpoint
    rows = {(r["replicas"], r["op"], r["session"], r["cache"]): r for r in result["rows"]}
    assert set(rows) == set(itertools.product((1, 2), ("history", "context"), ("10", str(EVENTS)), ("hit", "miss")))
    for key, r in rows.items():
        for load in ("c64", "c1"):
            m = r[load]
            assert m["requests"] > 0 and m["errors"] == 0, (key, load, m["first_error"])
            assert 0 < m["p50_ms"] <= m["p99_ms"], (key, load)
        # The guard's own record: the workers' counters say each row took the
        # path its name says (a context with its recall, over the bench's index).
        answered = r["c64"]["requests"] + r["c1"]["requests"]
        expected = {"hits": answered, "misses": 0} if r["cache"] == "hit" else {"hits": 0, "misses": answered}
        assert r["counted"] == {**expected, "recall_skipped": 0}, key
    assert {s["app_sessions"] for s in result["sessions_list"]} == {10, SESSIONS}
    assert all(s["rows"] == 10 for s in result["sessions_list"])  # a full page each
    for r in result["ratios"]:  # a target is met when the ratio is at most it; a comparison has none
        assert r["value"] > 0 and r["met"] == (None if r["target"] is None else r["value"] <= r["target"]), r
