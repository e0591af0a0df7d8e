"""Run the frameworks' own published session tests on memq, with the default
reads and with the fast path, and print what passed.

The test files are fetched by whoever runs this, never committed here:

* ADK: ``tests/unittests/sessions/test_session_service.py`` of google/adk-python
  (``--adk FILE``);
* OpenAI Agents SDK: its ``tests/`` folder, or a copy of the part of it that
  holds ``__init__.py``, ``test_responses.py``, ``memory/test_session.py``
  and ``memory/test_session_limit.py`` (``--agents DIR``).

Each suite is copied to a temporary folder and run there by pytest once per
mode (``memq``: default reads; ``memq-local``: ``consistency="own"`` and a
client made with ``local_reads=LocalWindows()``), with the plugin
infra/scripts/upstream_plugin.py, which gives every test a fresh memq stack
and swaps the framework's session for memq's (it says which tests it
deselects, and why). Prints a table and writes it as JSON::

    .venv/bin/python infra/scripts/upstream_suites.py \\
        --adk /tmp/upstream/adk/test_session_service.py --agents /tmp/upstream/agents/tests

Needs nats-server (as the adapter tests do) and the adk and openai-agents
extras; about 25 minutes on two cores (a stack per test). docs/guide/adapters.md
("Checked against the frameworks' own tests") has the results and the
upstream commits they were taken at.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("memq", "memq-local")
AGENTS_FILES = ("memory/test_session.py", "memory/test_session_limit.py")
AGENTS_HELPERS = ("__init__.py", "test_responses.py")
PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
pythonpath = .
timeout = 180
"""


@dataclass
class Outcome:
    """One suite in one mode."""

    suite: str
    mode: str
    collected: int = 0
    run: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0  # expected to fail: a known difference (expected_to_fail says which, and why)
    xpassed: int = 0  # expected to fail, and passed (counted in passed): a race the test won
    deselected: dict[str, str] = field(default_factory=dict)  # node id -> why
    expected_to_fail: dict[str, str] = field(default_factory=dict)  # node id -> why
    failures: dict[str, str] = field(default_factory=dict)  # node id -> first line of the failure
    files: dict[str, str] = field(default_factory=dict)  # fetched file -> sha256


def read_junit(xml: str) -> tuple[int, int, int, int, dict[str, str]]:
    """(passed, failed, skipped, xfailed, failures) of a pytest --junitxml
    report; an error (in setup or teardown) counts as a failure."""
    passed = failed = skipped = xfailed = 0
    failures: dict[str, str] = {}
    for case in ET.fromstring(xml).iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if bad is not None:
            failed += 1
            text = (bad.get("message") or bad.text or "").strip()
            failures[name] = (text.splitlines() or [""])[0][:300]
        elif (skip := case.find("skipped")) is not None:
            if skip.get("type") == "pytest.xfail":
                xfailed += 1
            else:
                skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, xfailed, failures


def reasons(deselected: dict[str, str]) -> dict[str, int]:
    """How many tests each reason deselected, most first."""
    counts: dict[str, int] = {}
    for why in deselected.values():
        counts[why] = counts.get(why, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a Markdown table."""
    rows = [
        "| suite | mode | collected | run on memq | passed | failed | known difference (xfail) | skipped | deselected |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        rows.append(
            f"| {o.suite} | {o.mode} | {o.collected} | {o.run} | {o.passed} | {o.failed} | {o.xfailed} "
            f"| {o.skipped} | {len(o.deselected)} |"
        )
    return "\n".join(rows)


def junit_name(nodeid: str) -> str:
    """A pytest node id as read_junit names the test (``classname::name``)."""
    path, _, name = nodeid.partition("::")
    return f"{path.removesuffix('.py').replace('/', '.')}::{name}"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage(suite: str, source: Path, into: Path) -> tuple[list[str], dict[str, str]]:
    """Copy a suite's fetched files into ``into``; the test files to run and their digests."""
    if suite == "adk":
        shutil.copy(source, into / source.name)
        return [source.name], {source.name: _sha(source)}
    tests = into / "tests"
    files, digests = [], {}
    for rel in (*AGENTS_HELPERS, *AGENTS_FILES):
        src = source / rel
        if not src.exists():
            if rel in AGENTS_FILES:
                continue
            raise SystemExit(f"{src}: missing (--agents takes the SDK's tests/ folder)")
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, tests / rel)
        digests[f"tests/{rel}"] = _sha(src)
        if rel in AGENTS_FILES:
            files.append(f"tests/{rel}")
    if not files:
        raise SystemExit(f"{source}: none of {', '.join(AGENTS_FILES)}")
    return files, digests


def run_suite(suite: str, source: Path, mode: str, pytest_args: list[str]) -> Outcome:
    outcome = Outcome(suite, mode)
    with tempfile.TemporaryDirectory(prefix=f"memq-upstream-{suite}-") as tmp:
        where = Path(tmp)
        files, outcome.files = stage(suite, source, where)
        (where / "pytest.ini").write_text(PYTEST_INI)
        report, deselected = where / "junit.xml", where / "deselected.json"
        env = {
            **os.environ,
            "MEMQ_UPSTREAM_SUITE": suite,
            "MEMQ_UPSTREAM_MODE": mode,
            "MEMQ_UPSTREAM_DESELECTED": str(deselected),
            "OPENAI_AGENTS_DISABLE_TRACING": "1",  # no trace export (no network)
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "infra" / "scripts"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
            ),
        }
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "upstream_plugin"]
        cmd += ["-o", "console_output_style=classic", f"--junitxml={report}", *files, *pytest_args]
        print(f"--- {suite} / {mode}: {' '.join(files)}", flush=True)
        proc = subprocess.run(cmd, cwd=where, env=env)
        if not report.exists():
            raise SystemExit(f"{suite} / {mode}: pytest wrote no report (exit {proc.returncode})")
        junit = read_junit(report.read_text())
        outcome.passed, outcome.failed, outcome.skipped, outcome.xfailed, outcome.failures = junit
        chosen = json.loads(deselected.read_text()) if deselected.exists() else {}
        outcome.deselected = chosen.get("deselected", {})
        outcome.expected_to_fail = chosen.get("expected_to_fail", {})
        # pytest's report has a non-strict xfail that passed as a pass
        expected_failed = sum(1 for node in outcome.expected_to_fail if junit_name(node) in outcome.failures)
        outcome.xpassed = len(outcome.expected_to_fail) - outcome.xfailed - expected_failed
    outcome.run = outcome.passed + outcome.failed + outcome.skipped + outcome.xfailed
    outcome.collected = outcome.run + len(outcome.deselected)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adk", type=Path, help="ADK's tests/unittests/sessions/test_session_service.py")
    parser.add_argument("--agents", type=Path, help="the OpenAI Agents SDK's tests/ folder")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", type=Path, default=ROOT / "bench-results" / "upstream-suites.json")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --), e.g. -k NAME -x")
    args = parser.parse_args()
    suites = [(name, path) for name, path in (("adk", args.adk), ("openai-agents", args.agents)) if path]
    if not suites:
        parser.error("give --adk FILE, --agents DIR, or both")
    outcomes = [run_suite(s, p.resolve(), m, args.pytest_args) for s, p in suites for m in args.modes]
    print()
    print(table(outcomes))
    for o in outcomes:
        print(f"\n{o.suite} / {o.mode}: deselected")
        for why, n in reasons(o.deselected).items():
            print(f"  {n:3d}  {why}")
        if o.expected_to_fail:
            print(f"{o.suite} / {o.mode}: run, expected to fail ({o.xfailed} did, {o.xpassed} passed)")
            for why, n in reasons(o.expected_to_fail).items():
                print(f"  {n:3d}  {why}")
        for name, first in o.failures.items():
            print(f"  FAILED {name}: {first}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    print(f"\nwritten: {args.json}")
    sys.exit(1 if any(o.failed for o in outcomes) else 0)


if __name__ == "__main__":
    main()
