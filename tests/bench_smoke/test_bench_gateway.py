"""tests/bench/gateway.py runs at its smallest size against real worker
processes (the gateway among them) and reports both paths of both reads,
every reply the same over HTTP as over NATS."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench_runs import bench_command

BENCH = bench_command("gateway")

pytestmark = pytest.mark.timeout(240)


def test_the_gateway_benchmark_runs_and_reports_http_beside_nats(tmp_path):
    out = tmp_path / "gateway.json"
    done = subprocess.run(
        [*BENCH, "--quick", "--seconds", "0.3", "--concurrency", "4", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = {(r["op"], r["path"]): r for r in result["runs"]}
    assert set(runs) == {("history", "nats"), ("history", "http"), ("context", "nats"), ("context", "http")}
    for r in runs.values():
        assert r["samples"] > 0 and r["p50_ms"] > 0 and r["requests_per_s"] > 0 and r["errors"] == 0
    assert [o["op"] for o in result["overhead"]] == ["history", "context"]
