"""The scope options of `memq export` and `memq index rebuild` (--app, --user,
--session) are refused before anything connects when no event could match
them: an empty id used to export nothing, or rebuild nothing, silently."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memq.workers.cli import app


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["export", "--app", ""], "app must not be empty"),
        (["export", "--app", "a", "--user", ""], "user must not be empty"),
        (["export", "--app", "a", "--user", "u", "--session", ""], "session must not be empty"),
        (["export", "--user", "u"], "--user needs --app"),
        (["index", "rebuild", "--app", ""], "app must not be empty"),
        (["index", "rebuild", "--app", "a", "--user", ""], "user must not be empty"),
        (["index", "rebuild", "--user", "u"], "--user needs --app"),
    ],
)
def test_a_scope_no_event_can_match_is_a_usage_error(args, says, tmp_path, monkeypatch):
    """No NATS and no database here: a command past its checks would fail with exit 1."""
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MEMQ_NATS__URL", "nats://127.0.0.1:1")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert says in result.output
