"""What an agent installs (`pip install memq`, the contracts) never pulls in the workers."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
HEAVY = ("memq.workers", "sqlalchemy", "sqlmodel", "faststream", "alembic", "typer", "rich", "redis")


def test_importing_the_client_loads_no_worker_code():
    code = (
        "import sys, memq.contracts, memq.contracts.client, memq.contracts.codec, memq.contracts.jsonschema;"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_base_dependencies_are_only_what_contracts_need():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = sorted(d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"])
    assert names == ["nats-py", "orjson", "pydantic", "uuid-utils"]
