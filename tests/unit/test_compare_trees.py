"""Which benchmarks compare_trees.py compares in both trees, and why it
leaves each of the others out."""

from __future__ import annotations

from pathlib import Path

from bench.compare_trees import Tree, bench_args, choose

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
