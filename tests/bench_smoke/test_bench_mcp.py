"""tests/bench/mcp_gateway.py runs at its smallest size against real worker
processes and `memq mcp` on both transports, and reports every path of both
reads, every reply the same size as over NATS."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench_runs import bench_command

BENCH = bench_command("mcp_gateway")

pytestmark = pytest.mark.timeout(300)


def test_the_mcp_benchmark_reports_tool_calls_beside_nats_and_http(tmp_path):
    out = tmp_path / "mcp.json"
    done = subprocess.run(
        [*BENCH, "--quick", "--seconds", "0.3", "--concurrency", "4", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = {(r["op"], r["path"]): r for r in result["runs"]}
    assert set(runs) == {
        (op, path) for op in ("search", "context") for path in ("nats", "http", "mcp-stdio", "mcp-http")
    }
    for r in runs.values():
        assert r["samples"] > 0 and r["p50_ms"] > 0 and r["requests_per_s"] > 0 and r["errors"] == 0
    assert {(o["op"], o["path"]) for o in result["beside_nats"]} == {
        (op, path) for op in ("search", "context") for path in ("http", "mcp-stdio", "mcp-http")
    }
