"""tests/bench/tenants.py runs at its smallest size against a real
multi-tenant deployment (accounts per app, worker processes, the gateway)
and reports B's four ops in every phase, none failing while idle."""

from __future__ import annotations

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(480)


def test_the_tenants_benchmark_reports_every_op_in_every_phase(tmp_path):
    result = run_bench(
        "tenants",
        *("--quick", "--seconds", "1", "--backlog", "100", "--waiters", "20", "--wait-ms", "2000"),
        out=tmp_path / "tenants.json",
        timeout=450,  # ~100 s alone; a parallel run on 2 cores has taken over 280 s
    )
    rows = {(r["phase"], r["op"]): r for r in result["rows"]}
    phases = ("idle", "waits", "template", "json", "backlog")
    assert set(rows) == {(p, op) for p in phases for op in ("append", "read", "search", "http read")}
    for op in ("append", "read", "search", "http read"):
        idle = rows["idle", op]
        assert idle["samples"] > 0 and idle["errors"] == 0 and idle["p99_over_idle"] == pytest.approx(1.0)
    assert result["config"] == {"seconds": 1.0, "backlog": 100, "waiters": 20, "wait_ms": 2000, "attacker_nice": 0}
