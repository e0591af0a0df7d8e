"""The two call-cost benchmarks that print a line per kind of call
(tests/bench/existence_check.py, tests/bench/forget.py) run a few calls each
on a real stack and print every kind, with percentiles in order; forget.py
itself checks that a read after the forgets holds exactly the turns left."""

from __future__ import annotations

import re

import pytest
from bench_runs import run_bench_output

pytestmark = pytest.mark.timeout(240)


def test_the_existence_check_benchmark_times_every_kind_of_call():
    printed = run_bench_output("existence_check", "--n", "4")

    found = re.findall(r"^(\w+ [\w=(), ]+?)\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms$", printed, re.M)
    lines = {kind: (p50, p99) for kind, p50, p99 in found}
    assert set(lines) == {
        "append_text create=True",
        "append_text create=False",
        "delete_session missing_ok=True",
        "delete_session (checked, default)",
    }, printed
    for kind, (p50, p99) in lines.items():
        assert 0 < float(p50) <= float(p99), kind


def test_the_forget_benchmark_forgets_in_both_modes():
    printed = run_bench_output("forget", "--n", "4")

    found = re.findall(
        r"^forget_event missing_ok=(\w+): p50 ([\d.]+) ms, p90 ([\d.]+) ms; the read after 4 forgets", printed, re.M
    )
    assert [mode for mode, _, _ in found] == ["False", "True"], printed
    assert all(0 < float(p50) <= float(p90) for _, p50, p90 in found), found
