"""tests/bench/rebuild_blip.py rebuilds a small index while a client searches
all along: the index switches generation, and the client sees answers and
no error (issue 32, "no blip"); it prints a table and writes the figures to
its JSON."""

from __future__ import annotations

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(300)


def test_the_blip_benchmark_switches_generation_without_an_error(tmp_path):
    args = ["--events", "40", "--every-ms", "20", "--after-s", "0.5"]
    result = run_bench("rebuild_blip", *args, out=tmp_path / "blip.json", timeout=240)
    figures = result["results"]

    assert result["benchmark"] == "rebuild_blip" and result["config"]["events"] == 40
    assert figures["backend"] == "embedded" and figures["events"] == 40
    before, after = figures["switched"].split(" -> ")
    assert before != after, figures
    assert isinstance(figures["rebuild_s"], float) and figures["rebuild_s"] >= 0, figures
    assert figures["answers"] > 0 and figures["errors"] == 0, figures["first_errors"]
