"""Which benchmarks compare_trees.py compares in both trees, and why it
leaves each of the others out, and its result file on the benchmarks page."""

from __future__ import annotations

import json
from pathlib import Path

import memq_refs
from bench.compare_trees import Runs, Tree, bench_args, choose, page
from bench.figures import compare

QUICK = 'parser.add_argument("--quick", action="store_true")\n'


def tree(root: Path, name: str, benches: dict[str, str]) -> Tree:
    (root / "tests" / "bench").mkdir(parents=True)
    for bench, text in benches.items():
        (root / "tests" / "bench" / f"{bench}.py").write_text(text)
    return Tree(name, root, root / "shim", scripts=name == "old")


def test_only_benchmarks_with_a_quick_run_in_both_trees_are_compared(tmp_path, monkeypatch):
    import run_bench

    names = ["agent_loop", "context_split", "fleet", "gateway", "ingest", "mcp_gateway", "retrieval"]
    monkeypatch.setattr(run_bench, "benchmarks", lambda: [*names, "compare_trees"])
    old = tree(
        tmp_path / "old",
        "old",
        {n: QUICK for n in names if n not in ("mcp_gateway", "ingest")} | {"ingest": "argparse"},
    )
    new = tree(tmp_path / "new", "new", {n: QUICK for n in names if n != "fleet"} | {"fleet": "argparse"})

    compared, skipped = choose(old, new, None, tmp_path / "no-locomo.json")
    assert compared == ["agent_loop", "gateway"]
    assert skipped["mcp_gateway"] == "not in the old tree"
    assert skipped["ingest"] == "no --quick in the old tree"
    assert skipped["fleet"] == "no --quick in the new tree"
    assert skipped["retrieval"].startswith("no LoCoMo file")
    assert skipped["context_split"].startswith("its --quick is the capture step")
    assert "compare_trees" not in compared and "compare_trees" not in skipped

    compared, skipped = choose(old, new, ["gateway", "nope", "agent_loop"], tmp_path / "no-locomo.json")
    assert compared == ["gateway", "agent_loop"]  # --only's order
    assert skipped["nope"] == "no such benchmark in the new tree"
    assert skipped["mcp_gateway"] == "not in the old tree"  # the real reason, not --only


def test_each_tree_runs_a_benchmark_its_own_way(tmp_path):
    old, new = Tree("old", tmp_path / "o", tmp_path / "s", True), Tree("new", tmp_path / "n", tmp_path / "t", False)
    args = bench_args("retrieval", tmp_path / "r.json", tmp_path / "locomo.json")
    assert args == ["--quick", "--json", str(tmp_path / "r.json"), "--data", str(tmp_path / "locomo.json")]
    assert old.command("retrieval", args)[1:] == [str(tmp_path / "o" / "tests" / "bench" / "retrieval.py"), *args]
    assert new.command("retrieval", args)[1:] == [str(tmp_path / "n" / "tests" / "run_bench.py"), "retrieval", *args]


def test_the_result_file_renders_on_the_benchmarks_page(tmp_path, monkeypatch):
    old = [{"p50_ms": 2.0, "errors": 0}, {"p50_ms": 3.0, "errors": 0}]
    new = [{"p50_ms": 3.5, "errors": 1}, {"p50_ms": 4.0, "errors": 0}]
    runs = Runs("gateway", old, new, {"old": [20.0, 22.0], "new": [21.0, 23.0]})
    rows = compare(runs.old, runs.new)[0]
    machine = {"date": "2026-11-27T23:00:00+00:00", "git": "abc1234", "nproc": 2, "cpu": "EPYC"}
    machine |= {"cpu_busy_at_start": 0.5, "load_at_start": (4.0, 3.0, 2.0)}
    body = {"machine": machine, "config": {"old": "966ac2d", "runs": 2}}
    body["results"] = {"gateway": {"figures": [r.summary() for r in rows], "seconds": runs.seconds}}
    (tmp_path / "compare_trees.json").write_text(json.dumps(body | page(body)))
    monkeypatch.setattr(memq_refs, "RESULTS", tmp_path)

    text = memq_refs.benchmark_markdown("compare_trees")
    assert "at commit `abc1234`, 2026-11-27, on 2 cores, EPYC; old tree 966ac2d, 2 --quick runs" in text
    assert "| gateway | 2 | 0 | 0 of 1 | 20–22 / 21–23 |" in text
    assert "| gateway | p50_ms | 2.5 [2–3] | 3.75 [3.5–4] | spread |" in text
    assert "| gateway | errors | 0 [0–0] | 0.5 [0–1] | exact |" in text
