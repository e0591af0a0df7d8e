"""tests/bench/ingest.py runs at a small size against real persistence
worker processes, in both timings: live, and draining a backlog published
while the consumer was paused. Each run checks that SQL holds every
published event exactly once (the script exits 1 otherwise)."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench_runs import bench_command

BENCH = bench_command("ingest")

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("backlog", [False, True], ids=["live", "backlog"])
def test_the_ingest_benchmark_commits_every_event_once(tmp_path, backlog):
    out = tmp_path / "ingest.json"
    args = ["--quick", "--databases", "postgresql", "--replicas", "1,2", "--events", "400", "--sessions", "8"]
    done = subprocess.run(
        [*BENCH, *args, *(["--backlog"] if backlog else []), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"]["backlog"] is backlog
    assert [r["replicas"] for r in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["exactly_once"] and row["stored_rows"] == 400 + row["paced_events"]
        assert row["commit_per_s"] > 0
