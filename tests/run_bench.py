"""Run one benchmark of the ``bench`` package (tests/bench/) by name:

    .venv/bin/python tests/run_bench.py retrieval --quick
    .venv/bin/python tests/run_bench.py --list

The benchmarks import the shared test modules (``helpers``, ``services``) and
each other (``bench.locomo``) as modules of tests/, the folder Python puts
first on ``sys.path`` for this script; ``python -m bench.NAME`` from tests/
does the same. Every argument after the name goes to the benchmark.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "bench"


def benchmarks() -> list[str]:
    """The modules of tests/bench/ with a command line (the rest are libraries, and
    bare_pipeline.py a process agent_loop.py starts by its file)."""
    return sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_") and "argparse" in p.read_text())


def main(argv: list[str]) -> int:
    names = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip() + "\n\nbenchmarks: " + " ".join(names))
        return 0 if argv else 2
    name, *args = argv
    if name not in names:
        print(f"no benchmark {name!r}; one of: {' '.join(names)}", file=sys.stderr)
        return 2
    sys.argv = [str(BENCH / f"{name}.py"), *args]  # the benchmark's usage line names its file
    runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
