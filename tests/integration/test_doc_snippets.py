"""Every code snippet of the documentation runs, against a real stack.

Each ```python block of README.md and docs/**/*.md is run as a program
against `memq up` (embedded NATS, SQLite, the embedded index, every worker),
with the stack's URL in place of ``nats://127.0.0.1:4222``; it fails the test
if it exits non-zero. A block opts out only with a marker on the line right
before it, which must give a reason:

    <!-- snippet: skip (deployment-only: needs a TLS cluster) -->

Shell blocks (```bash, ```sh, ```console) made only of quick `memq`
commands that do not stop the stack (`.venv/bin/memq demo`, `… export`,
`… status`) run too, as pasted into a fresh shell beside the same stack;
documented `.venv/bin/python SCRIPT …` commands run as far as their argument
parsing, `.venv/bin/pytest …` ones as far as collecting. Every other command
is checked without running by tests/unit/test_docs.py (tests/docsnippets.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from docsnippets import Snippet, shell_commands, shell_snippets, snippets

ROOT = Path(__file__).parents[2]
MEMQ = Path(sys.prefix) / "bin" / "memq"
DOC_URL = "nats://127.0.0.1:4222"  # what snippets connect to: `memq up`'s default
DOC_HTTP_URL = "http://127.0.0.1:8480"  # the HTTP gateway's default, replaced by the stack's
# memq commands a shell block may run beside the stack: quick, and they do not stop it
CLI_OK = (
    "demo",
    "sessions list",
    "sessions show",
    "status",
    "config",
    "history",
    "context",
    "search",
    "dlq list",
    "export",
)
# The stack runs as docs/guide/summaries.md tells readers to start it for its example.
SUMMARY_APPS = '{"tiny-budget": {"strategy": "summary_buffer", "budget": 400}}'


def runnable(snippet: Snippet) -> bool:
    """A shell block made only of `memq` commands that CLI_OK lists (a bare
    `memq`, not on PATH in a fresh shell, then fails as it would for a reader)."""
    commands = shell_commands(snippet)
    return bool(commands) and all(
        c.argv[0] in ("memq", ".venv/bin/memq") and " ".join(c.argv[1:]).startswith(CLI_OK) for c in commands
    )


PYTHON = [s for s in snippets() if s.lang in ("python", "py")]
SHELL = shell_snippets()
CLI = [s for s in SHELL if runnable(s) and not s.skip]


def test_there_are_snippets_and_skips_are_rare():
    assert len(PYTHON) >= 5, [s.id for s in PYTHON]
    skipped = [s.id for s in PYTHON if s.skip]
    assert len(skipped) <= len(PYTHON) // 4, f"most snippets must run; skipped: {skipped}"


def test_the_stack_runs_as_the_docs_say():
    assert f"MEMQ_QUERY__APPS='{SUMMARY_APPS}' bash infra/dev.sh up" in (ROOT / "docs/guide/summaries.md").read_text()


def memq_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    # the HTTP gateway of `memq up` on any free port: test runs side by side do not collide
    return {**env, "MEMQ_DATA_DIR": str(data_dir), "MEMQ_LOG_LEVEL": "WARNING", "MEMQ_HTTP__PORT": "0", **extra}


@dataclass
class Stack:
    url: str
    data_dir: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    """`memq up` as a user runs it, on a free port, in its own data dir."""
    data_dir = tmp_path_factory.mktemp("memq-docs")
    log_path = data_dir / "up.log"
    url_file = data_dir / "run" / "nats.url"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(MEMQ), "up", "--nats-port", "0"],
            env=memq_env(data_dir, MEMQ_LOG_LEVEL="INFO", MEMQ_QUERY__APPS=SUMMARY_APPS),
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 120
        # the line the quickstart tells readers to wait for
        while not (url_file.is_file() and "memq ready" in log_path.read_text(errors="replace")):
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        yield Stack(url_file.read_text().strip(), data_dir)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("snippet", PYTHON, ids=[s.id for s in PYTHON])
def test_python_snippet_runs(snippet: Snippet, stack: Stack, tmp_path: Path):
    if snippet.skip:
        pytest.skip(f"marked in the docs: {snippet.skip}")
    assert DOC_URL in snippet.code or "MemoryClient" not in snippet.code, (
        f"{snippet.id}: connect to {DOC_URL} (the test puts the stack's URL there)"
    )
    program = tmp_path / "snippet.py"
    http_url = (stack.data_dir / "run" / "http.url").read_text().strip()
    program.write_text(snippet.code.replace(DOC_URL, stack.url).replace(DOC_HTTP_URL, http_url))
    run = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=memq_env(stack.data_dir),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, f"{snippet.id} failed:\n{run.stdout}\n{run.stderr}"


def fresh_shell(stack: Stack, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder that stands for the checkout (its .venv is this test's), and
    the environment of a fresh shell there: nothing of the virtualenv on
    PATH, and only MEMQ_DATA_DIR set, to find this test's stack."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    venv = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in venv)
    env = {k: v for k, v in memq_env(stack.data_dir).items() if k != "VIRTUAL_ENV"}
    return checkout, {**env, "PATH": path}


@pytest.mark.parametrize("snippet", CLI, ids=[s.id for s in CLI])
def test_cli_snippet_runs(snippet: Snippet, stack: Stack, tmp_path: Path):
    """The block as pasted into a fresh shell (bash, stopping at the first
    failure); what it redirects into a file must not be empty."""
    checkout, env = fresh_shell(stack, tmp_path)
    run = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", snippet.code],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{snippet.id} failed in a fresh shell:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    for command in shell_commands(snippet):
        if command.stdout:
            written = checkout / command.stdout
            assert written.is_file() and written.stat().st_size > 0, f"{snippet.id}: `{command.text}` wrote nothing"


def test_shell_blocks_run_or_are_checked():
    """The runnable blocks cover the commands the guides lead with."""
    ran = {" ".join(c.argv[:2]) for s in CLI for c in shell_commands(s)}
    assert {".venv/bin/memq demo", ".venv/bin/memq export", ".venv/bin/memq sessions", ".venv/bin/memq status"} <= ran


ARGPARSE = [
    c
    for s in SHELL
    for c in shell_commands(s)
    if c.argv[0] == ".venv/bin/sphinx-build" or (c.argv[0] == ".venv/bin/python" and c.argv[1:2] != ("-m",))
]


@pytest.mark.parametrize("command", ARGPARSE, ids=[f"{c.snippet.id}:{' '.join(c.argv[:2])}" for c in ARGPARSE])
def test_python_command_arguments_parse(command):
    """A documented `.venv/bin/python SCRIPT ARGS` (or sphinx-build) run as
    far as argparse: the script exists and takes these arguments."""
    program = command.argv[1] if command.argv[0] == ".venv/bin/python" else str(MEMQ.parent / "sphinx-build")
    args = command.argv[2:] if command.argv[0] == ".venv/bin/python" else command.argv[1:]
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests/argparse_only.py"), program, *args],
        cwd=ROOT / command.cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{command.snippet.id}: `{command.text}`:\n{run.stderr[-2000:]}"


PYTEST = [c for s in SHELL for c in shell_commands(s) if c.argv[0] == ".venv/bin/pytest"]


@pytest.mark.parametrize("command", PYTEST, ids=[c.snippet.id for c in PYTEST])
def test_pytest_command_collects(command):
    """A documented `.venv/bin/pytest ARGS` collects tests with these arguments."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *command.argv[1:]],
        cwd=ROOT / command.cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{command.snippet.id}: `{command.text}`:\n{run.stdout[-2000:]}"


def test_quickstart_shows_the_ready_line_memq_up_prints(stack: Stack):
    """The sample line the quickstart says to wait for is the one `memq up`
    prints, but for the addresses and the data dir."""
    printed = next(
        line for line in (stack.data_dir / "up.log").read_text().splitlines() if line.startswith("memq ready")
    )
    page = (ROOT / "docs/quickstart.md").read_text()
    sample = next(s.code for s in snippets() if s.path == "docs/quickstart.md" and s.code.startswith("memq ready"))
    assert sample in page

    def shape(line: str) -> str:
        line = re.sub(r"\b[a-z]+://[^\s,]+", "URL", line)
        line = re.sub(r"(?<=\bdata ).+?(?=, workers )", "DIR", line)  # the dir, and whether it is new
        return re.sub(r"try `\S*memq demo`", "try `memq demo`", line)  # the path depends on PATH

    assert shape(sample.strip()) == shape(printed.strip())
