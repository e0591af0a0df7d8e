"""tests/bench/quota_scale.py at its smallest (``--smoke``: 1 and 2 replicas
of persistence, indexing and query, a few events and docs): every step is
measured at each N against N = 1, the rebuild embeds exactly its app's docs,
a verdict is given for each step, and (where this machine lets a process
make cgroups) each replica is held to its quota and every cgroup is removed
afterwards. Without cgroups it runs the many-core form, ``--quota 0``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench import cpuquota
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(300)

QUOTA = 0.25
STEPS = ["ingest", "indexing", "rebuild", "history", "context"]


def within_quota(window_s: float, period_s: float = 0.1, tick_s: float = 0.01) -> float:
    """The most cores a replica held to QUOTA can show over ``window_s``."""
    return max(QUOTA * 1.6 + 0.05, (QUOTA * (window_s + 2 * period_s) + 2 * tick_s) / window_s)


def quotas_here() -> bool:
    try:
        cpuquota.Quotas(f"memq-test-probe-{os.getpid()}").close()
    except cpuquota.Unavailable:
        return False
    return True


def leftovers() -> list[str]:
    try:
        _, base = cpuquota.find_hierarchy()
    except cpuquota.Unavailable:
        return []
    return sorted(p.name for p in base.glob("memq-quota-scale-*"))


def test_the_quota_benchmark_measures_every_kind_at_each_n(tmp_path: Path):
    limited = quotas_here()
    before = leftovers()
    quota = QUOTA if limited else 0.0
    result = run_bench("quota_scale", "--smoke", "--quota", str(quota), out=tmp_path / "quota_scale.json", timeout=280)

    steps = result["steps"]
    assert [(s["op"], s["replicas"]) for s in steps] == [(op, n) for n in (1, 2) for op in STEPS]
    for s in steps:
        assert s["units"] > 0 and s["seconds"] > 0 and s["errors"] == 0, s
        assert s["per_s"] == pytest.approx(s["units"] / s["seconds"], rel=0.01, abs=0.1)
        assert len(s["replica_cores"]) == s["replicas"], s
    rebuilt = [s["units"] for s in steps if s["op"] == "rebuild"]
    assert rebuilt == [result["config"]["rebuild_docs"]] * 2  # every doc of the app, none of the others
    rows = result["tables"][0]["rows"]
    assert [r["x"] for r in rows if r["n"] == 1] == [1.0] * len(STEPS)
    assert set(result["verdicts"]) == set(STEPS)
    assert all(v.startswith(f"{op}: 2 replicas") for op, v in result["verdicts"].items())
    if limited:
        assert result["measured"]["conditions"].startswith(f"`--smoke`; {QUOTA:g} core per replica")
        for s in steps:
            # A replica held to its quota stays under it, give or take what a window
            # of a loaded VM lets through: /proc's 10 ms ticks at each end, and the
            # kernel's quota per 100 ms period, which a window cut across a period
            # boundary at each end can collect once more at each. Unconfined a
            # replica takes 0.5-1 core.
            assert max(s["replica_cores"]) <= within_quota(s["window_s"]), s
            assert len(s["throttled"]) == s["replicas"], s
        assert leftovers() == before  # every cgroup the run made is gone
