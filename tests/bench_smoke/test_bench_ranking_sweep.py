"""tests/bench/ranking_sweep.py sweeps a recall setting on a tiny
LoCoMo-shaped conversation: a row per value, every recall in [0, 1]."""

from __future__ import annotations

import re

import pytest
from bench_runs import run_bench_output, tiny_locomo

pytestmark = pytest.mark.timeout(180)


def test_the_ranking_sweep_prints_a_row_of_recalls_per_value(tmp_path):
    data = tiny_locomo(tmp_path / "locomo.json", sessions=1)
    out = run_bench_output("ranking_sweep", "--data", str(data), "--field", "date_boost", "--values", "0", "0.3")

    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] in ("0.0", "0.3"):
            rows[cells[0]] = cells[1:]
    assert set(rows) == {"0.0", "0.3"}, out
    for value, cells in rows.items():
        *recalls, p50 = cells
        scored = [float(r) for r in recalls if r != "–"]  # a category the file does not ask shows a dash
        assert scored and all(0.0 <= r <= 1.0 for r in scored), (value, cells)
        assert float(p50) > 0, (value, cells)
