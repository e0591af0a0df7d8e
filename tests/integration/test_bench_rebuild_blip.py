"""tests/bench/rebuild_blip.py rebuilds a small index while a client searches
all along: the index switches generation, and the client sees answers and
no error (issue 32, "no blip")."""

from __future__ import annotations

import json

import pytest
from bench_runs import run_bench_output

pytestmark = pytest.mark.timeout(300)


def test_the_blip_benchmark_switches_generation_without_an_error():
    printed = run_bench_output("rebuild_blip", "--events", "40", "--every-ms", "20", "--after-s", "0.5", timeout=240)
    figures, _ = json.JSONDecoder().raw_decode(printed, printed.index('{\n  "backend"'))  # its one JSON print

    assert figures["backend"] == "embedded" and figures["events"] == 40
    before, after = figures["switched"].split(" -> ")
    assert before != after, figures
    assert figures["answers"] > 0 and figures["errors"] == 0, figures["first_errors"]
