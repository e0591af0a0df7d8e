"""tests/bench/agent_loop.py runs at its smallest size against real worker
processes, and every memq turn reads its own write: the context answered
after an append holds that append (read-your-writes through the real client).
So does every turn of the bare pipeline (memq's hops without memq)."""

from __future__ import annotations

import json
import subprocess

import pytest
from bench_runs import bench_command

BENCH = bench_command("agent_loop")

pytestmark = pytest.mark.timeout(240)


def test_the_agent_loop_benchmark_runs_and_every_turn_reads_its_own_write(tmp_path):
    out = tmp_path / "agent_loop.json"
    done = subprocess.run(
        [*BENCH, "--agents", "1,4", "--seconds", "0.5", "--rounds", "1", "--gc-threshold", "50", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = {(r["path"], r["agents"]): r for r in result["runs"]}
    paths = ("memq", "memq any", "memq carry", "memq one-publish", "memq carry history", "memq one-publish history")
    paths += ("get_session", "get_session local", "sql", "bare", "bare tail")
    assert set(runs) == {(path, n) for path in paths for n in (1, 4)}
    for r in runs.values():
        assert r["turns"] > 0 and r["p50_ms"] > 0 and r["errors"] == 0 and r["ryw_violations"] == 0
        assert r["gc"]["all_ms_per_turn"] > 0, r  # a first generation of 50 objects is collected in every loop
    assert result["config"]["gc_threshold"] == 50
    assert set(runs["memq carry", 4]["steps_p50_ms"]) == {"append user", "context", "append assistant"}
    assert set(runs["memq one-publish", 4]["steps_p50_ms"]) == {"append user", "context", "append assistant"}
    assert set(runs["memq one-publish history", 4]["steps_p50_ms"]) == {"append user", "history", "append assistant"}
    assert set(runs["get_session local", 4]["steps_p50_ms"]) == {"append user", "get_session", "append assistant"}
    assert [t["what"].split(":")[0] for t in result["targets"]] == ["1 agent"] * 4
    assert [f["agents"] for f in result["floor"]] == [1, 4]
    local = {(r["agents"], r["what"]) for r in result["local"]}
    assert (1, "memq one-publish ÷ sql") in local and (4, "get_session local ÷ get_session") in local
    assert (4, "memq one-publish ÷ memq carry") in local and (
        4,
        "memq one-publish history ÷ memq carry history",
    ) in local


def test_the_search_loops_run_and_every_waiting_search_finds_its_append(tmp_path):
    out = tmp_path / "agent_loop_search.json"
    done = subprocess.run(
        [*BENCH, "--search", "--agents", "1", "--seconds", "0.5", "--rounds", "1"] + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {r["path"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"search wait", "search no wait"}
    for r in runs.values():
        assert r["turns"] > 0 and r["errors"] == 0 and r["ryw_violations"] == 0
    assert runs["search wait"]["missed"] == 0
    assert set(runs["search wait"]["steps_p50_ms"]) >= {"append", "search"}
