"""The test tree imports its shared modules by name (pytest's ``pythonpath``,
pyproject.toml): no module edits ``sys.path``, and none imports a conftest.

Two conftest.py files (tests/ and tests/integration/) are both the module
``conftest`` to Python, so ``from conftest import x`` gets whichever was
imported first: it passed on one machine and failed to collect eleven test
modules in CI. Shared code lives in a plain module (helpers.py, services.py,
bench/) instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import run_bench

TESTS = Path(__file__).resolve().parents[1]
MODULES = sorted(TESTS.rglob("*.py"))


def offences(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        # a package's own (`from .conftest import`, tests/security/) names one file
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "conftest":
            found.append((node.lineno, f"from {node.module} import …"))
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "conftest" for a in node.names):
            found.append((node.lineno, "import conftest"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("insert", "append", "extend")
            and ast.unparse(node.func.value) == "sys.path"
        ):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_check_sees_what_it_forbids():
    code = "import sys\nsys.path.insert(0, 'x')\nfrom conftest import running\nimport conftest\n"
    assert [line for line, _ in offences(ast.parse(code))] == [2, 3, 4]
    allowed = "from helpers import running\nfrom .conftest import A\nx = 'sys.path.insert(0, p)'\n"
    assert offences(ast.parse(allowed)) == []


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(TESTS)) for p in MODULES])
def test_no_test_module_edits_sys_path_or_imports_a_conftest(path):
    assert offences(ast.parse(path.read_text(), str(path))) == []


def test_no_import_needs_a_noqa_e402():
    # imports come first once nothing has to edit sys.path before them
    noqa = "noqa: " + "E402"  # spelled apart, or this file would hold it
    assert [str(p.relative_to(TESTS)) for p in MODULES if noqa in p.read_text()] == []


# Benchmarks with no smoke run in the test command, and why (none now: each has
# a smoke form, the long ones a size or a canned input made for the test).
NO_SMOKE: dict[str, str] = {}


SMOKE = TESTS / "bench_smoke"  # the benchmarks' smoke tests, apart from the behaviour tests
RUNS_A_BENCHMARK = re.compile(r"(?:bench_command|run_bench|run_bench_output)\(\s*\"(\w+)\"")


def test_every_benchmark_has_a_smoke_test():
    """Each benchmark tests/run_bench.py runs is run by a test in
    tests/bench_smoke/ (through bench_runs.py), or NO_SMOKE says why not: a
    benchmark no test runs rots."""
    ran = set()
    for path in SMOKE.glob("test_*.py"):
        ran |= set(RUNS_A_BENCHMARK.findall(path.read_text()))
    names = set(run_bench.benchmarks())
    assert names - ran == set(NO_SMOKE), f"benchmarks without a smoke test: {sorted(names - ran - set(NO_SMOKE))}"


def test_benchmark_smoke_tests_live_in_their_own_folder():
    """A test that runs a benchmark is a smoke test: it goes in tests/bench_smoke/
    (docs/contributing.md, "Where a test goes"), and every test there runs one."""
    tests = sorted(TESTS.rglob("test_*.py"))
    elsewhere = [
        str(p.relative_to(TESTS)) for p in tests if p.parent != SMOKE and RUNS_A_BENCHMARK.search(p.read_text())
    ]
    assert elsewhere == []
    idle = [p.name for p in tests if p.parent == SMOKE and not RUNS_A_BENCHMARK.search(p.read_text())]
    assert idle == []


def test_the_runner_names_its_benchmarks_and_refuses_others(capsys):
    assert run_bench.main(["--list"]) == 0
    assert "retrieval" in capsys.readouterr().out.split("benchmarks:")[1].split()
    assert run_bench.main(["benchlib"]) == 2  # a library of the package, not a benchmark
    assert "no benchmark 'benchlib'" in capsys.readouterr().err
