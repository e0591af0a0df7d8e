"""tests/bench/scale.py at its smallest (``--smoke``: one replica of each
kind, one NATS node, no fault phase): every step runs and measures, the
publish → commit latency comes from the commit notices (the path that broke
when CommitWatch lost ``commit_time``), and the exactly-once checks pass."""

from __future__ import annotations

import math

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(300)


def test_the_scale_benchmark_runs_every_step_and_every_check_passes(tmp_path):
    result = run_bench("scale", "--smoke", out=tmp_path / "scale.json", timeout=280)

    assert result["mode"] == "smoke" and result["config"]["replicas"] == [1]
    assert result["fault"] is None
    [phase] = result["phases"]
    assert phase["replicas"] == 1 and phase["events"] == result["config"]["events"]
    assert phase["ingest_per_s"] > 0 and phase["indexing_docs"] >= phase["events"]
    assert [q["op"] for q in phase["queries"]] == ["history", "context"]
    assert all(q["requests"] > 0 and q["errors"] == 0 for q in phase["queries"]), phase["queries"]
    # every paced append's latency measured from the notice naming its seq
    assert phase["paced_events"] > 0
    assert 0 < phase["paced_p50_ms"] <= phase["paced_p99_ms"] and not math.isnan(phase["paced_p99_ms"])
    failed = [c for c in result["checks"] if not c["ok"]]
    assert result["passed"] and not failed, failed
