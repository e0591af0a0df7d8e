"""Operators' commands run with an app's NATS credentials (issue 27, item 5),
against a real nats-server with the accounts config of `memq nats accounts`.

Each must fail within seconds with one line on stderr: forbidden, and which
credentials it needs; no traceback, no retrying "JetStream unavailable".
Before, `memq status` and `memq dlq list` ended in a ``TimeoutError``
traceback, `memq init` and `memq index rebuild` retried for a minute or more.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from services import NatsServer
from services import running as running_service

from memq.contracts.client import app_inbox_prefix
from memq.workers import security

pytestmark = pytest.mark.timeout(300)

MEMQ = Path(sys.prefix) / "bin" / "memq"
A = "app-a"
FAST_S = 10.0  # the process's own start (imports) included

ADMIN_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["dlq", "list"],
    ["dlq", "replay", "--all"],
    ["index", "rebuild"],
    ["init"],
    ["import", "{export}"],
]


@dataclass
class Stack:
    url: str
    passwords: dict[str, str]
    tmp: Path
    export: Path

    def env(self, user: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        return {
            **env,
            "MEMQ_DATA_DIR": str(self.tmp / "data"),
            "MEMQ_NATS__URL": self.url,
            "MEMQ_NATS__USER": user,
            "MEMQ_NATS__PASSWORD": self.passwords[user],
            "MEMQ_DATABASE__URL": f"sqlite+aiosqlite:///{self.tmp}/memq.db",
            "MEMQ_INDEXING__EMBEDDER": "none",
            "MEMQ_LOG_LEVEL": "WARNING",
            **extra,
        }


def memq(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([str(MEMQ), *args], env=env, capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    names = security.user_names([A])
    passwords, hashed = security.generate_passwords(names)
    memq_users, system_users = security.build_users([A], hashed)
    config = security.render_accounts(memq_users, system_users)
    tmp = tmp_path_factory.mktemp("admin")
    with running_service(functools.partial(NatsServer, config=config)) as server:
        s = Stack(server.url, passwords, tmp, tmp / "empty.jsonl")
        done, _ = memq(["init"], s.env("admin"))  # the streams and the database, as operators make them
        assert done.returncode == 0, done.stderr
        exported, _ = memq(["export", "--out", str(s.export)], s.env("admin"))
        assert exported.returncode == 0, exported.stderr
        yield s


def app_env(stack: Stack, inbox: bool) -> dict[str, str]:
    """An app's environment as `memq nats accounts` hands it out (with its
    inbox prefix), or only its user and password."""
    user = security.app_user_name(A)
    extra = {"MEMQ_NATS__INBOX_PREFIX": app_inbox_prefix(A)} if inbox else {}
    return stack.env(user, **extra)


@pytest.mark.parametrize("inbox", [True, False], ids=["app-env", "app-user-only"])
@pytest.mark.parametrize("command", ADMIN_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_admin_command_as_an_app_says_forbidden_in_one_line(stack: Stack, command: list[str], inbox: bool):
    args = [a.replace("{export}", str(stack.export)) for a in command]
    result, took = memq(args, app_env(stack, inbox))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "TimeoutError" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("forbidden:"), line
    assert "admin" in line and "MEMQ_NATS__USER" in line and "MEMQ_NATS__PASSWORD" in line, line
    assert "CREDS_FILE" in line, line
    assert took < FAST_S, f"{' '.join(args)} took {took:.1f}s to refuse"
    print(f"memq {' '.join(command)}: {took:.1f}s: {line[:160]}")


def test_the_operators_users_still_run_them(stack: Stack):
    status, _ = memq(["status", "--json"], stack.env("admin"))
    assert status.returncode == 0, status.stderr
    assert "consumers" in json.loads(status.stdout)  # none yet: no worker ran
    # The workers user may not ping $SRV (it answers pings): status still shows the consumers.
    status, _ = memq(["status", "--json"], stack.env("workers"))
    assert status.returncode == 0, status.stderr
    listed, _ = memq(["dlq", "list"], stack.env("workers"))
    assert listed.returncode == 0, listed.stderr
