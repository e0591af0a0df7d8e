"""The two call-cost benchmarks (tests/bench/existence_check.py,
tests/bench/forget.py) run a few calls each on a real stack, print a table
and write every kind of call's percentiles, in order, to their JSON;
forget.py itself checks that a read after the forgets holds exactly the
turns left."""

from __future__ import annotations

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(240)


def is_ms(value: object) -> bool:
    return isinstance(value, float) and value > 0


def test_the_existence_check_benchmark_times_every_kind_of_call(tmp_path):
    result = run_bench("existence_check", "--n", "4", out=tmp_path / "existence_check.json")

    assert result["benchmark"] == "existence_check" and result["config"] == {"n": 4}
    assert [r["call"] for r in result["rows"]] == [
        "append_text create=True",
        "append_text create=False",
        "delete_session missing_ok=True",
        "delete_session (checked, default)",
    ]
    for r in result["rows"]:
        assert r["n"] == 4 and is_ms(r["p50_ms"]) and is_ms(r["p99_ms"]), r
        assert r["p50_ms"] <= r["p99_ms"], r


def test_the_forget_benchmark_forgets_in_both_modes(tmp_path):
    result = run_bench("forget", "--n", "4", out=tmp_path / "forget.json")

    assert result["benchmark"] == "forget" and result["config"] == {"n": 4}
    assert [r["call"] for r in result["rows"]] == ["forget_event missing_ok=False", "forget_event missing_ok=True"]
    for r in result["rows"]:
        assert r["n"] == 4 and all(is_ms(r[k]) for k in ("p50_ms", "p90_ms", "read_after_ms")), r
        assert r["p50_ms"] <= r["p90_ms"], r
