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
from pathlib import Path

import pytest

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
