"""tests/bench/langgraph_store.py runs at a small size against a real stack
and reports every MemqStore op beside the client call it is made of."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench_runs import bench_command

BENCH = bench_command("langgraph_store")

pytestmark = pytest.mark.timeout(240)


def test_the_store_benchmark_runs_and_reports_each_op(tmp_path):
    out = tmp_path / "store.json"
    done = subprocess.run(
        [*BENCH, "--items", "5", "--rounds", "3", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [op.split(" (")[0].strip() for op in results] == [
        "put",
        "append",
        "get",
        "get_state",
        "search",
        "search",
        "list",
        "list_namespaces",
    ]
    assert all(r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in results.values())
