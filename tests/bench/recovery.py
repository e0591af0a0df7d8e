"""How long a user sees failures after a server is SIGKILLed and restarted:
PostgreSQL, Weaviate and the NATS node leading the R3 stream.

Runs the fault tests of ``tests/faults/test_service_faults.py`` (the real
stack, each worker its own process, under steady load; see
docs/operations/faults.md) ``--runs`` times each, idle and, with
``--busy N``, beside N processes spinning a core each (a loaded machine),
and prints for each fault the median and worst of: how long queries failed
counted from the kill and from the repair, the longest an append waited for
its ack, and how long after the repair appends still waited over 1 s. A run
whose test failed is still counted (its figures are what is measured); the
failure is reported beside it.

    PYTHONPATH=<shim> .venv/bin/python tests/run_bench.py recovery --runs 3 --busy 0 2 \\
        --json docs/benchmarks/results/recovery.json

``--test FAULT=NODE`` runs another pytest node as FAULT (a new fault test
before it is added here; the smoke test's canned one, which records fixed
figures in a second, so the test command runs this script's whole path
without running the fault tests a second time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.benchlib import machine_info, status

ROOT = Path(__file__).resolve().parents[2]
TESTS = {
    "postgres": "tests/faults/test_service_faults.py::test_postgres_killed",
    "weaviate": "tests/faults/test_service_faults.py::test_weaviate_killed",
    "nats-leader": "tests/faults/test_service_faults.py::test_nats_stream_leader_killed",
}
FIGURES = (
    "queries_failed_from_kill_s",
    "queries_failed_after_repair_s",
    "append_max_wait_s",
    "appends_slow_after_repair_s",
)


def spin(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep a core busy."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_one(test: str, record: Path) -> tuple[dict | None, bool]:
    """One run of ``test``: its figures (None if it recorded none) and whether it passed."""
    before = len(record.read_text().splitlines()) if record.exists() else 0
    env = {**os.environ, "MEMQ_FAULT_RECORD": str(record)}
    cmd = [sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "--no-header"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = record.read_text().splitlines() if record.exists() else []
    figures = json.loads(lines[-1]) if len(lines) > before else None
    if done.returncode != 0:
        tail = [line for line in done.stdout.splitlines() if "queries still failed" in line or "Error" in line]
        status(f"{test} failed: {tail[:3]}")
    return figures, done.returncode == 0


def load_average() -> float:
    return os.getloadavg()[0]


def measure(tests: dict[str, str], faults: list[str], runs: int, busy: int, record: Path) -> list[dict]:
    rows = []
    spinners = spin(busy)
    try:
        for fault in faults:
            results, loads = [], []
            for i in range(runs):
                loads.append(load_average())
                status(f"{fault}, busy {busy}, run {i + 1}/{runs} (load average {loads[-1]:.1f})")
                figures, passed = run_one(tests[fault], record)
                if figures is not None:
                    results.append({**figures, "passed": passed})
            rows.append({"fault": fault, "busy": busy, "load_average": loads, "runs": results})
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return rows


def table(rows: list[dict]) -> str:
    head = "| fault | busy cores | load avg | contention | runs (passed) | " + " | ".join(FIGURES) + " |"
    out = [head, "|" + "---|" * (5 + len(FIGURES))]
    for row in rows:
        runs = row["runs"]
        cells = []
        for name in FIGURES:
            values = [r[name] for r in runs]
            cells.append(f"{statistics.median(values):.1f} / {max(values):.1f}" if values else "-")
        load = statistics.mean(row["load_average"]) if row["load_average"] else 0.0
        passed = sum(r["passed"] for r in runs)
        contention = statistics.median([r.get("contention", 1.0) for r in runs]) if runs else 1.0
        out.append(
            f"| {row['fault']} | {row['busy']} | {load:.1f} | {contention:.1f} | {len(runs)} ({passed}) | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(out) + "\n\n(seconds: median / worst)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", nargs="+", default=list(TESTS), help=f"of {', '.join(TESTS)} and those of --test")
    ap.add_argument(
        "--test", action="append", default=[], metavar="FAULT=NODE", help="run pytest node NODE as fault FAULT"
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="spinning processes: one measurement each")
    ap.add_argument("--json", type=Path, help="write the machine, every run's figures and the table here")
    args = ap.parse_args()
    tests = dict(TESTS)
    for spec in args.test:
        fault, sep, node = spec.partition("=")
        if not sep or not fault or not node:
            ap.error(f"--test {spec!r}: expected FAULT=NODE")
        tests[fault] = node
    if unknown := [f for f in args.faults if f not in tests]:
        ap.error(f"unknown fault(s) {', '.join(unknown)}: one of {', '.join(tests)}")
    machine = machine_info()
    # Every run's figures as they come, kept: a long measurement cut short still has them.
    record = args.json.with_suffix(".jsonl") if args.json else Path(tempfile.mkstemp(suffix=".jsonl")[1])
    status(f"figures of each run go to {record}")
    rows = [row for busy in args.busy for row in measure(tests, args.faults, args.runs, busy, record)]
    text = table(rows)
    print(f"commit {machine['git']}, {machine['nproc']} cores ({machine['cpu']}), {machine['date']}")
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows, "table": text}, indent=2) + "\n")


if __name__ == "__main__":
    main()
