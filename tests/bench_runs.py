"""What the benchmarks' smoke tests (tests/integration/test_bench_*.py) share:
the command that runs a benchmark as the docs show it, one run that must exit 0
and write its JSON, and a LoCoMo-shaped file small enough for a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).resolve().parent / "run_bench.py"


def bench_command(name: str) -> list[str]:
    """``.venv/bin/python tests/run_bench.py NAME``, with this test's Python."""
    return [sys.executable, str(RUNNER), name]


def run_bench(name: str, *args: str, out: Path, timeout: float = 200) -> dict[str, Any]:
    """Run the benchmark with ``--json OUT``; fail with its output's tail
    unless it exits 0, and return what it wrote."""
    done = subprocess.run(
        [*bench_command(name), *args, "--json", str(out)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())
