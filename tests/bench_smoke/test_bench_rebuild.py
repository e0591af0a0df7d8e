"""tests/bench/rebuild.py rebuilds a few events with two indexing replicas
(one replica runs the same job alone, so two cover it and the sharing):
every event indexed exactly once, the replicas' documents adding up to the
events, the rebuild between two raw-embedder runs."""

from __future__ import annotations

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(180)

EVENTS = 20


def test_the_rebuild_benchmark_indexes_every_event_exactly_once(tmp_path):
    result = run_bench("rebuild", "--replicas", "2", "--events", str(EVENTS), out=tmp_path / "rebuild.json")

    assert result["config"]["events"] == EVENTS and result["config"]["replicas"] == [2]
    rows = result["rows"]
    assert [r["replicas"] for r in rows] == [0, 2, 0]  # raw, rebuild, raw
    for r in rows:
        assert r["exactly_once"] and r["events"] == EVENTS, r["run"]
        assert r["events_per_s"] * r["seconds"] == pytest.approx(EVENTS, rel=1e-6), r["run"]
    for r in rows[1::2]:
        assert len(r["docs_per_replica"]) == r["replicas"] and sum(r["docs_per_replica"]) == EVENTS, r
    raw = [r["ratio_to_raw"] for r in rows[0::2]]
    assert sum(raw) / len(raw) == pytest.approx(1.0)  # raw runs are scored against their own mean
