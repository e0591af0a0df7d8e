"""tests/bench/recovery.py runs each fault test as pytest would and tables
the figures it records. The real fault tests run in the test command already
(tests/faults/); here two canned ones stand in, seconds each: one records
figures and passes, one records figures and fails (its figures still count,
its failure is reported beside them)."""

from __future__ import annotations

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(180)

CANNED = """
import json
import os


def record(**figures):
    with open(os.environ["MEMQ_FAULT_RECORD"], "a") as f:
        f.write(json.dumps(figures) + "\\n")


def test_passes():
    record(queries_failed_from_kill_s=1.5, queries_failed_after_repair_s=0.25, append_max_wait_s=2.0,
           appends_slow_after_repair_s=0.0, contention=1.0)


def test_fails():
    record(queries_failed_from_kill_s=9.0, queries_failed_after_repair_s=4.0, append_max_wait_s=6.0,
           appends_slow_after_repair_s=3.0, contention=1.0)
    assert False, "queries still failed"
"""


def test_the_recovery_benchmark_tables_what_each_fault_test_records(tmp_path):
    tests = tmp_path / "canned_faults.py"
    tests.write_text(CANNED)
    result = run_bench(
        "recovery",
        *("--test", f"quick={tests}::test_passes", "--test", f"broken={tests}::test_fails"),
        *("--faults", "quick", "broken", "--runs", "1", "--busy", "0"),
        out=tmp_path / "recovery.json",
    )

    rows = {r["fault"]: r for r in result["rows"]}
    assert set(rows) == {"quick", "broken"} and all(r["busy"] == 0 for r in rows.values())
    assert [run["passed"] for run in rows["quick"]["runs"]] == [True]
    assert [run["passed"] for run in rows["broken"]["runs"]] == [False]  # measured, failure kept
    assert rows["broken"]["runs"][0]["queries_failed_from_kill_s"] == 9.0
    lines = {line.split("|")[1].strip(): line for line in result["table"].splitlines() if line.startswith("| ")}
    assert "| 1 (1) | 1.5 / 1.5 | 0.2 / 0.2 | 2.0 / 2.0 | 0.0 / 0.0 |" in lines["quick"]
    assert "| 1 (0) | 9.0 / 9.0 | 4.0 / 4.0 | 6.0 / 6.0 | 3.0 / 3.0 |" in lines["broken"]
    assert result["machine"]["git"]
