"""The two calibration benchmarks of the relevance floor and the grams index
(tests/bench/floor_calibration.py, tests/bench/grams_cost.py) run at a tiny
size and write tables whose rows agree with each other."""

from __future__ import annotations

import pytest
from bench import floor_calibration
from bench_runs import run_bench, tiny_locomo

pytestmark = pytest.mark.timeout(240)


def test_the_floor_calibration_picks_a_floor_within_its_loss(tmp_path):
    # two conversations: one's turns are the other's unrelated pairs; no
    # question of this file is found by the vector side alone (it used to crash)
    data = tiny_locomo(tmp_path / "locomo.json", conversations=2)
    result = run_bench("floor_calibration", "--data", str(data), "--max-loss", "0.1", out=tmp_path / "floor.json")

    rows = result["rows"]
    assert [r["floor"] for r in rows] == floor_calibration.FLOORS
    for r in rows:
        assert all(0 <= r[k] <= 1 for k in ("vector_recall10_cost", "vector_only_lost", "unrelated_kept")), r
    assert rows[0]["vector_recall10_cost"] == 0 and rows[0]["unrelated_kept"] == 1  # a floor of 0 drops nothing
    # a higher floor drops more: it costs no less recall and keeps no more noise
    for lower, higher in zip(rows, rows[1:]):
        assert higher["vector_recall10_cost"] >= lower["vector_recall10_cost"]
        assert higher["unrelated_kept"] <= lower["unrelated_kept"]
    chosen = next(r for r in rows if r["floor"] == result["chosen"])
    assert chosen["vector_recall10_cost"] <= 0.1
    assert all(r["vector_recall10_cost"] > 0.1 for r in rows if r["floor"] > result["chosen"])


def test_the_grams_cost_benchmark_finds_chinese_only_with_grams(tmp_path):
    result = run_bench("grams_cost", "--docs", "40", out=tmp_path / "grams.json")

    assert result["docs"] == 40
    runs = result["results"]
    assert set(runs) == {f"{lang}-{mode}" for lang in ("english", "chinese") for mode in ("before", "grams")}
    for name, r in runs.items():
        assert r["bytes"] > 0 and r["search_p50_ms"] > 0 and 0 <= r["queries_found"] <= 1, name
    # the point of grams: words of a language without spaces are found; English loses nothing
    assert runs["chinese-grams"]["queries_found"] > runs["chinese-before"]["queries_found"]
    assert runs["english-grams"]["queries_found"] == runs["english-before"]["queries_found"]
