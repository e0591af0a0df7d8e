"""tests/bench/runtime.py runs at its smallest size, and the owned batch
consumer it measures acks every message once, with no batch redelivered."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench_runs import bench_command

BENCH = bench_command("runtime")

pytestmark = pytest.mark.timeout(240)


def test_the_runtime_benchmark_runs_and_the_owned_consumer_loses_nothing(tmp_path):
    out = tmp_path / "runtime.json"
    done = subprocess.run(
        [*BENCH, "--smoke", "--runs", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "batch consume" in done.stdout and "request/reply" in done.stdout and "commit notices" in done.stdout
    result = json.loads(out.read_text())
    assert result["machine"]["faststream"] and result["machine"]["cpu"]
    consume, reply = result["results"]["consume"], result["results"]["reply"]
    assert set(consume) == {"owned BatchConsumer (nats-py)", "FastStream PullSub(batch=True)"}
    owned = consume["owned BatchConsumer (nats-py)"]
    assert owned["per_s"] > 0 and owned["missing"] == [0] and owned["late_batches"] == [0]
    assert set(reply) == {"nats micro endpoint", "FastStream subscriber"}
    assert all(row["p50_ms"] > 0 and row["per_s"] > 0 for row in reply.values())
    notices = result["results"]["notices"]  # each hearer printed "done": it heard every notice
    assert set(notices) == {"nats-py subscription", "FastStream subscriber"}
    assert all(row["per_s"] > 0 for row in notices.values())
