"""The import layering, checked with import-linter against the contracts in
pyproject.toml ([tool.importlinter]):

- ``contracts`` (what an agent installs) never imports ``workers``;
- ``workers/memory/`` is pure: no I/O package, not even through another module;
- the worker kinds (persistence, indexing, summarizer, facts, query, http)
  are peers: none imports another, directly or through a shared module;
- the process runtime (``workers/runtime/``) imports no kind;
- no import cycle among the modules and packages of any one package.

The same contracts are then run on a small synthetic tree shaped like memq,
once per kind of violation, to show that each one is caught.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: the import graph is built from what that
# interpreter can import (the editable memq, or the synthetic tree on
# PYTHONPATH), and no cache is written anywhere.
CHECK = textwrap.dedent(
    """
    import contextlib, io, json, sys, tomllib
    from importlinter.cli import lint_imports

    config = sys.argv[1]
    ids = [c["id"] for c in tomllib.load(open(config, "rb"))["tool"]["importlinter"]["contracts"]]
    kept = {}
    for contract in ids:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            kept[contract] = lint_imports(config, limit_to_contracts=(contract,), no_cache=True) == 0
        if not kept[contract] and "BROKEN" not in out.getvalue():  # an error, not a verdict
            sys.exit(out.getvalue())
    print(json.dumps(kept))
    """
)


def configured() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


# The contract types that read the kinds' registry (pyproject's contract_types).
CONTRACT_TYPES = ROOT / "infra" / "scripts"


def with_contract_types(pythonpath: Path | None = None) -> dict[str, str]:
    paths = [str(CONTRACT_TYPES)] + ([str(pythonpath)] if pythonpath is not None else [])
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_check(config: Path, pythonpath: Path | None = None) -> dict[str, bool]:
    env = with_contract_types(pythonpath)
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(config)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_memq_keeps_its_layers():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))",
        ],
        cwd=ROOT,
        env=with_contract_types(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_rule_is_configured():
    ids = {c["id"] for c in configured()["contracts"]}
    assert ids == {"contracts-light", "memory-pure", "kinds-are-peers", "runtime-names-no-kind", "acyclic"}


def test_the_kind_rules_read_every_registered_kind_from_the_registry():
    # A new kind is registered in kinds.py alone: both rules take the kinds'
    # packages from there (infra/scripts/kind_contracts.py), plus the
    # folders they list themselves.
    spec = importlib.util.spec_from_file_location("kind_contracts", CONTRACT_TYPES / "kind_contracts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # by its path: no test edits sys.path
    kind_packages = module.kind_packages
    from memq.workers.runtime.kinds import KINDS

    packages = {kind.component.partition(":")[0].rpartition(".")[0] for kind in KINDS.values()}
    contracts = {c["id"]: c for c in configured()["contracts"]}
    for id, field in (("kinds-are-peers", "modules"), ("runtime-names-no-kind", "forbidden_modules")):
        assert contracts[id]["type"].startswith("kinds_")
        assert (
            set(kind_packages(contracts[id]["registry"])) == packages == set(kind_packages(contracts[id]["registry"]))
        )
        assert not packages & set(contracts[id].get(field, [])), f"{id} lists a registered kind again"
    assert "memq.workers.facts" in packages


# --- the same contracts on a synthetic memq ---------------------------------------

FAKE = "fakeq"
KINDS = ("persistence", "indexing", "summarizer", "query", "http", "facts")

# A clean tree shaped like memq: contracts, pure memory, SQL, the worker kinds.
CLEAN = {
    "contracts/__init__.py": "",
    "contracts/errors.py": "class MemqError(Exception): ...\n",
    "workers/__init__.py": "",
    "workers/memory/__init__.py": "",
    "workers/memory/strategies.py": "from fakeq.contracts.errors import MemqError\n",
    "workers/sql/__init__.py": "",
    "workers/sql/reads.py": "import sqlalchemy\nfrom fakeq.workers.memory import strategies\n",
    "workers/shared.py": "import nats\n",
    "workers/runtime/__init__.py": "",
    # The registry the kind rules read (as memq's kinds.py: "module:Class" strings).
    "workers/runtime/kinds.py": (
        "from types import SimpleNamespace as Kind\n\n"
        f"KINDS = {{k: Kind(component=f'fakeq.workers.{{k}}.worker:W') for k in {KINDS!r}}}\n"
    ),
    "workers/runtime/app.py": "import importlib\nfrom fakeq.workers import shared\n",
    **{f"workers/{kind}/__init__.py": "" for kind in KINDS},
    **{
        f"workers/{kind}/worker.py": (
            "from fakeq.workers import shared\nfrom fakeq.workers.runtime import app\nfrom fakeq.workers.sql import reads\n"
        )
        for kind in KINDS
    },
    "workers/summarizer/llm.py": "",
    "workers/summarizer/summarizers.py": "",
    "workers/mcp/__init__.py": "",  # neither kinds nor runtime: they run a process of their own
    "workers/cli/__init__.py": "from fakeq.workers.runtime import app\n",
}

TYPE_ONLY = """\
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from {}
"""

# One violation each: (files added or replaced, the contract that must break).
VIOLATIONS = {
    "contracts import workers": ({"contracts/errors.py": "from fakeq.workers import shared\n"}, "contracts-light"),
    "memory imports an I/O package": ({"workers/memory/state.py": "import sqlalchemy\n"}, "memory-pure"),
    "memory imports os-level I/O": ({"workers/memory/state.py": "import subprocess\n"}, "memory-pure"),
    "memory reaches I/O through a module": (
        {"workers/memory/state.py": "from fakeq.workers import shared\n"},
        "memory-pure",
    ),
    "a kind imports another": (
        {"workers/summarizer/worker.py": "from fakeq.workers.query import worker\n"},
        "kinds-are-peers",
    ),
    "a kind reaches another through a shared module": (
        {"workers/shared.py": "import nats\nfrom fakeq.workers.query import worker\n"},
        "kinds-are-peers",
    ),
    "the runtime imports a kind": (
        {"workers/runtime/app.py": "from fakeq.workers.query import worker\n"},
        "runtime-names-no-kind",
    ),
    "two modules import each other": (
        {
            "workers/summarizer/llm.py": "from fakeq.workers.summarizer import summarizers\n",
            "workers/summarizer/summarizers.py": "from fakeq.workers.summarizer import llm\n",
        },
        "acyclic",
    ),
    # Type-only imports count: a loop of them is still a loop, and a kind
    # that names another's types is coupled to it.
    "a type-only import loop": (
        {
            "workers/runtime/app.py": "import importlib\nfrom fakeq.workers.runtime import component\n",
            "workers/runtime/component.py": TYPE_ONLY.format("fakeq.workers.runtime import app"),
        },
        "acyclic",
    ),
    "a kind imports another's types": (
        {"workers/query/types.py": TYPE_ONLY.format("fakeq.workers.persistence import worker")},
        "kinds-are-peers",
    ),
    "two packages import each other": (
        {"workers/memory/strategies.py": "def f():\n    from fakeq.workers.sql import reads\n"},
        "acyclic",
    ),
}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"unexpected {type(value).__name__} in [tool.importlinter]")


def fake_config(directory: Path) -> Path:
    """pyproject's [tool.importlinter], with memq's names turned into the fake's."""

    def rename(value):
        if isinstance(value, str):
            return value.replace("memq.", f"{FAKE}.")
        if isinstance(value, list):
            return [rename(v) for v in value]
        return value

    section = configured()
    lines = ["[tool.importlinter]"]
    lines += [f"{k} = {_toml_value(rename(v))}" for k, v in section.items() if k != "contracts"]
    for contract in section["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{k} = {_toml_value(rename(v))}" for k, v in contract.items()]
    path = directory / "pyproject.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def build(directory: Path, files: dict[str, str]) -> Path:
    # The fake root is a namespace package, as memq is.
    for name, text in {**CLEAN, **files}.items():
        path = directory / "src" / FAKE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory / "src"


def test_a_clean_tree_keeps_every_contract(tmp_path):
    kept = run_check(fake_config(tmp_path), build(tmp_path, {}))
    assert kept == {
        "contracts-light": True,
        "memory-pure": True,
        "kinds-are-peers": True,
        "runtime-names-no-kind": True,
        "acyclic": True,
    }


@pytest.mark.parametrize("case", list(VIOLATIONS))
def test_each_violation_is_caught(tmp_path, case):
    files, contract = VIOLATIONS[case]
    kept = run_check(fake_config(tmp_path), build(tmp_path, files))
    assert kept[contract] is False, f"{case}: {contract} was kept"
