"""The pure parts of infra/scripts/upstream_suites.py (the harness that runs
ADK's and the Agents SDK's own session tests on memq): reading pytest's
JUnit report, counting deselection reasons, the table. The run itself needs
the fetched upstream files and is not part of this suite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "infra" / "scripts"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("upstream_suites", SCRIPTS / "upstream_suites.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["upstream_suites"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["upstream_suites"]


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
 <testcase classname="test_session_service" name="test_get_empty_session[IN_MEMORY]" time="1.0"/>
 <testcase classname="test_session_service" name="test_append_event_complete[IN_MEMORY]" time="1.0">
  <failure message="AssertionError: assert Session(...) == Session(...)&#10;second line">trace</failure>
 </testcase>
 <testcase classname="test_session_service" name="test_setup_broke" time="0.1">
  <error message="">boom in setup</error>
 </testcase>
 <testcase classname="tests.memory.test_session" name="test_skipped" time="0.0">
  <skipped message="no nats-server"/>
 </testcase>
 <testcase classname="tests.memory.test_session" name="test_other_loop[run_sync]" time="7.0">
  <skipped type="pytest.xfail" message="drives the session from another thread's event loop"/>
 </testcase>
</testsuite></testsuites>"""


def test_read_junit_counts_passed_failed_skipped_xfailed_and_keeps_each_failures_first_line(harness):
    passed, failed, skipped, xfailed, failures = harness.read_junit(JUNIT)
    assert (passed, failed, skipped, xfailed) == (1, 2, 1, 1)
    assert failures == {
        "test_session_service::test_append_event_complete[IN_MEMORY]": "AssertionError: assert Session(...) == Session(...)",
        "test_session_service::test_setup_broke": "boom in setup",  # an error counts as a failure
    }


def test_reasons_counts_each_reason_most_first(harness):
    deselected = {"a": "ADK's DATABASE backend", "b": "uses no session", "c": "ADK's DATABASE backend"}
    assert list(harness.reasons(deselected).items()) == [("ADK's DATABASE backend", 2), ("uses no session", 1)]


def test_table_has_a_row_per_suite_and_mode(harness):
    deselected = {f"d{i}": "why" for i in range(6)}
    outcome = harness.Outcome(
        "adk", "memq-local", collected=11, run=5, passed=3, failed=1, xfailed=1, deselected=deselected
    )
    rows = harness.table([outcome]).splitlines()
    assert rows[0].startswith("| suite | mode | collected | run on memq | passed | failed | known difference (xfail) |")
    assert rows[2] == "| adk | memq-local | 11 | 5 | 3 | 1 | 1 | 0 | 6 |"


def test_junit_name_is_how_read_junit_names_a_node(harness):
    node = "tests/memory/test_session.py::test_session_limit_zero[run_sync]"
    assert harness.junit_name(node) == "tests.memory.test_session::test_session_limit_zero[run_sync]"
