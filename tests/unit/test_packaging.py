"""The installed package: memq ships as ``memq.contracts`` and ``memq.workers``.

The repository keeps the folders ``contracts/`` and ``workers/`` at its top and
pyproject.toml maps them under the ``memq`` namespace with an explicit list of
packages. These tests check that the list names every package folder, that the
wheel carries every file of those folders, and that the wheel installs and
imports in a fresh venv beside another distribution that owns the import name
``contracts``, which is why the namespace exists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("contracts", "workers")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_folders() -> set[str]:
    """The import name of every folder with an __init__.py under contracts/ and workers/."""
    names = set()
    for top in PACKAGE_FOLDERS:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            names.add("memq." + ".".join(init.parent.relative_to(ROOT).parts))
    return names


def _shipped_files() -> set[str]:
    """Every file under contracts/ and workers/, as the wheel names it (memq/...)."""
    files = set()
    for top in PACKAGE_FOLDERS:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add("memq/" + path.relative_to(ROOT).as_posix())
    return files


def test_packages_list_names_every_package_folder():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = _package_folders()
    assert not on_disk - listed, f"package folders missing from [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"[tool.setuptools] packages names folders that are gone: {sorted(listed - on_disk)}"


def _build_wheel(source: Path, out: Path) -> Path:
    """Build a wheel offline with the running interpreter's setuptools."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(source)]
    proc = subprocess.run(pip + build, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"building {source.name} failed:\n{proc.stdout}\n{proc.stderr}"
    (wheel,) = out.glob("*.whl")
    return wheel


def _copy_source(dest: Path) -> Path:
    """The project's build inputs in a scratch folder: an in-tree build would leave
    build/ behind, whose stale copies of moved modules the next wheel would ship."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for top in PACKAGE_FOLDERS:
        shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _foreign_contracts(dest: Path) -> Path:
    """A distribution that owns the top-level import name `contracts`, as PyPI ones do."""
    (dest / "contracts").mkdir(parents=True)
    (dest / "contracts" / "__init__.py").write_text('OWNER = "foreign-contracts"\n')
    (dest / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=70.1"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "foreign-contracts"
            version = "1.0"

            [tool.setuptools]
            packages = ["contracts"]
            """
        )
    )
    return dest


@pytest.fixture(scope="module")
def memq_wheel(tmp_path_factory) -> Path:
    scratch = tmp_path_factory.mktemp("memq-wheel")
    return _build_wheel(_copy_source(scratch / "src"), scratch / "dist")


def test_wheel_carries_every_file_of_the_package_folders(memq_wheel):
    """Python modules, the JSON Schemas, the migrations' script template and versions."""
    with zipfile.ZipFile(memq_wheel) as wheel:
        names = set(wheel.namelist())
    missing = _shipped_files() - names
    assert not missing, f"the wheel lacks (add them to [tool.setuptools.package-data]): {sorted(missing)}"
    assert any(n.startswith("memq/contracts/schemas/") and n.endswith(".json") for n in names)
    assert any(n.startswith("memq/workers/sql/migrations/versions/") for n in names)
    # memq is a namespace: the wheel owns memq.contracts and memq.workers, nothing at the top
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("memq-")}
    assert tops == {"memq"}, tops
    assert "memq/__init__.py" not in names


def test_wheel_imports_beside_a_foreign_contracts(memq_wheel, tmp_path):
    foreign_wheel = _build_wheel(_foreign_contracts(tmp_path / "foreign"), tmp_path / "foreign-dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    # the running pip installs into the new venv's interpreter (a venv without pip is made in milliseconds)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    install = ["install", "--no-index", "--no-deps", "-q", str(foreign_wheel), str(memq_wheel)]
    proc = subprocess.run(pip + install, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"installing the wheels failed:\n{proc.stdout}\n{proc.stderr}"

    # memq's third-party dependencies come from the dev venv's site-packages on
    # PYTHONPATH: .pth files are not read there, so its editable memq (a finder
    # that a .pth installs) stays out, and memq can only come from the wheel.
    site = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(sorted(site))
    probe = textwrap.dedent(
        """\
        import json, sys
        import contracts
        import memq.contracts.client, memq.contracts.codec
        import memq.workers.settings
        print(json.dumps({
            "owner": getattr(contracts, "OWNER", None),
            "contracts": contracts.__file__,
            "memq_contracts": memq.contracts.__file__,
            "memq_workers": memq.workers.settings.__file__,
            "codec_decodes": callable(memq.contracts.codec.decode),
        }))
        """
    )
    run = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    installed = str(venv.resolve())
    assert seen["owner"] == "foreign-contracts", seen
    assert seen["contracts"].startswith(installed), seen
    assert seen["memq_contracts"].startswith(installed), seen
    assert seen["memq_workers"].startswith(installed), seen
    assert seen["codec_decodes"], seen
