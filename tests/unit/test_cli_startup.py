"""`memq --help` and `memq config` answer at once: the command's modules import
what a command needs when it runs, not at start (no timed test: the modules
imported are what decides the time, and they do not vary with the machine's load)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from typer.main import get_command

from memq.workers.cli import app

MEMQ = str(Path(sys.prefix) / "bin" / "memq")
# What made `memq --help` take 1.2-2.6 s: every worker's stack, imported by
# the command modules; and typer's rich help (Markdown, syntax, tracebacks).
HEAVY = (
    "faststream",
    "nats",
    "sqlalchemy",
    "sqlmodel",
    "alembic",
    "weaviate",
    "onnxruntime",
    "tokenizers",
    "numpy",
    "tiktoken",
    "redis",
    "httpx",
    "starlette",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "memq.contracts.client",
    "memq.contracts.queries",
    "typer.rich_utils",
    "rich.markdown",
    "rich.traceback",
)


def imported(tmp_path: Path, *args: str, code: int = 0) -> set[str]:
    """The modules `memq ARGS` imports (``-X importtime``); it exits with ``code``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env["MEMQ_DATA_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", MEMQ, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == code, out.stderr[-2000:]
    names = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    return names


@pytest.mark.parametrize("args", [["--help"], ["config"], ["status", "--help"]], ids=" ".join)
def test_quick_commands_import_no_heavy_module(tmp_path, args):
    names = imported(tmp_path, *args)
    assert "memq.workers.cli" in names  # the measurement works
    heavy = sorted(name for name in names if name in HEAVY)
    assert heavy == [], f"`memq {' '.join(args)}` imports {heavy}"


def test_help_alone_reads_no_settings(tmp_path):
    assert "pydantic_settings" not in imported(tmp_path, "--help")


def _commands(group: click.Command, path: str = "memq"):
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from _commands(command, f"{path} {name}")


@pytest.mark.parametrize("path", [p for p, _ in _commands(get_command(app))])
def test_help_is_plain_text(path):
    """No reStructuredText (``nats.url``, :mod:) or rich markup in any help."""
    command = dict(_commands(get_command(app)))[path]
    with click.Context(command, info_name=path) as ctx:
        text = command.get_help(ctx)
    for markup in ("``", ":mod:", ":class:", ":func:", "[/", "[red]", "[bold"):
        assert markup not in text, f"{path} --help shows {markup!r}:\n{text}"


@pytest.mark.parametrize("problem", ["out of range", "taken"])
def test_up_stopped_by_its_checks_imports_no_worker_code(tmp_path, problem):
    """Its checks come first, and answer as quickly as `memq config`."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = "99999" if problem == "out of range" else str(taken.getsockname()[1])
        names = imported(tmp_path, "up", "--nats-port", port, code=2 if problem == "out of range" else 1)
    assert "memq.workers.settings" in names
    assert ("memq.workers.cli.preflight" in names) == (problem == "taken")
    assert sorted(name for name in names if name in HEAVY) == []
