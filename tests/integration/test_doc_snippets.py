"""Every code snippet of the documentation runs, against a real stack.

Each ```python block of README.md and docs/**/*.md is run as a program
against `memq up` (embedded NATS, SQLite, the embedded index, every worker),
with the stack's URL in place of ``nats://127.0.0.1:4222``; it fails the test
if it exits non-zero. A block opts out only with a marker on the line right
before it, which must give a reason:

    <!-- snippet: skip (deployment-only: needs a TLS cluster) -->

```bash blocks made only of read-only `memq` commands (`.venv/bin/memq demo`,
`memq status`, …) run too, beside the same stack.
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

ROOT = Path(__file__).parents[2]
MEMQ = Path(sys.prefix) / "bin" / "memq"
DOC_URL = "nats://127.0.0.1:4222"  # what snippets connect to: `memq up`'s default
DOC_HTTP_URL = "http://127.0.0.1:8480"  # the HTTP gateway's default, replaced by the stack's
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```\s*$", re.M | re.S)
# memq commands a bash snippet may run beside the stack: quick, and they do not stop it
CLI_OK = ("demo", "sessions list", "sessions show", "status", "config", "history", "context", "search", "dlq list")
# The stack runs as docs/guide/summaries.md tells readers to start it for its example.
SUMMARY_APPS = '{"tiny-budget": {"strategy": "summary_buffer", "budget": 400}}'


@dataclass(frozen=True)
class Snippet:
    path: str
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not {"_build", "_generated"} & set(p.parts)]
    return [ROOT / "README.md", *docs]


def snippets() -> list[Snippet]:
    found = []
    for path in doc_files():
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = [ln.strip() for ln in text[: m.start()].splitlines() if ln.strip()]
            marker = SKIP.match(before[-1]) if before else None
            lang = m.group("lang").lower()
            body = "\n".join(ln[len(m.group("indent")) :] for ln in m.group("body").splitlines())
            found.append(
                Snippet(str(path.relative_to(ROOT)), line, lang, body, marker.group("reason") if marker else None)
            )
    return found


def cli_lines(snippet: Snippet) -> list[list[str]] | None:
    """The commands of a bash snippet made only of runnable `memq` commands, else None."""
    commands = []
    for raw in snippet.code.splitlines():
        line = raw.split("  #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0] not in ("memq", ".venv/bin/memq") or not " ".join(words[1:]).startswith(CLI_OK):
            return None
        commands.append(words[1:])
    return commands or None


PYTHON = [s for s in snippets() if s.lang in ("python", "py")]
CLI = [s for s in snippets() if s.lang in ("bash", "sh") and cli_lines(s)]


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


@pytest.mark.parametrize("snippet", CLI, ids=[s.id for s in CLI])
def test_cli_snippet_runs(snippet: Snippet, stack: Stack):
    for args in cli_lines(snippet) or []:
        run = subprocess.run(
            [str(MEMQ), *args], env=memq_env(stack.data_dir), capture_output=True, text=True, timeout=180
        )
        assert run.returncode == 0, f"{snippet.id}: memq {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
