"""What the read commands print (issue 40): `memq sessions list` cut ids
short (``demo-01a233ab-f…``) at 80 columns and in a pipe, some read commands
had ``--json`` and some not, and there was no ``memq --version``."""

from __future__ import annotations

import io
import json
from importlib.metadata import version

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from memq.contracts.queries import SessionInfo, SessionsPage
from memq.workers.cli import app, common, reads

# Commands that write, run or generate (what they print is no read of memq's
# data): every other command is a read, and a read has --json. A new read
# command without it fails here; a new writer is added to this list.
NOT_READS = {
    "up",
    "worker",
    "init",
    "demo",
    "config",  # prints JSON, always
    "forget",
    "sessions delete",
    "index rebuild",
    "index drop",
    "dlq replay",
    "export",
    "import",
    "nats accounts",
    "asyncapi",
    "mcp",
}


def _commands(group, prefix: str = "") -> dict:
    """Every leaf command by its full name (typer's groups have ``commands``)."""
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


COMMANDS = _commands(typer.main.get_command(app))  # type: ignore[arg-type]


def test_the_list_of_writers_names_real_commands():
    assert NOT_READS <= set(COMMANDS), NOT_READS - set(COMMANDS)


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - NOT_READS))
def test_every_read_command_has_json(name):
    options = {opt for param in COMMANDS[name].params for opt in getattr(param, "opts", [])}
    assert "--json" in options, f"memq {name} has no --json"


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"memq {version('memq')}"


DEMO_IDS = [("demo-user", "demo-01a233ab-f5c6-7d8e-9f00-112233445566")]  # what `memq demo` writes
LONG_IDS = [*DEMO_IDS, ("a-user-with-a-rather-long-id@example.com", "support-ticket-2026-12-02-0001-follow-up")]


def _page(ids: list[tuple[str, str]]) -> SessionsPage:
    return SessionsPage(
        sessions=[
            SessionInfo(app="memq-demo", user=u, session=s, created_at=1.7e9, updated_at=1.7e9 + 60, last_seq=12345)
            for u, s in ids
        ]
    )


def _list(monkeypatch, out: Console, *args: str, page: SessionsPage | None = None):
    monkeypatch.setattr(reads, "_with_client", lambda app_id, work: page or _page(LONG_IDS))
    monkeypatch.setattr(reads, "console", out)
    monkeypatch.setattr(common, "console", out)
    return CliRunner().invoke(app, ["sessions", "list", *args])


def _shown(monkeypatch, terminal: bool, ids: list[tuple[str, str]]) -> str:
    buffer = io.StringIO()
    out = Console(file=buffer, width=80, force_terminal=terminal, color_system=None, legacy_windows=False)
    result = _list(monkeypatch, out, page=_page(ids))
    assert result.exit_code == 0, result.output
    shown = buffer.getvalue()
    assert "…" not in shown, shown
    return shown


def test_in_a_pipe_sessions_list_prints_every_id_whole_on_its_line(monkeypatch):
    """A pipe is 80 columns to rich: the lines are as wide as the ids instead."""
    lines = _shown(monkeypatch, False, LONG_IDS).splitlines()
    for user, session in LONG_IDS:
        assert any(user in line and session in line for line in lines), lines
        assert any("12345" in line and session in line for line in lines), lines  # the row's other cells too


def test_at_an_80_column_terminal_the_times_fold_and_the_ids_stay_whole(monkeypatch):
    lines = _shown(monkeypatch, True, DEMO_IDS).splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    ((user, session),) = DEMO_IDS
    assert any(user in line and session in line for line in lines), lines


def test_sessions_list_json(monkeypatch):
    buffer = io.StringIO()
    result = _list(monkeypatch, Console(file=buffer, width=80, color_system=None), "--json")
    assert result.exit_code == 0, result.output
    assert SessionsPage.model_validate(json.loads(buffer.getvalue())) == _page(LONG_IDS)
