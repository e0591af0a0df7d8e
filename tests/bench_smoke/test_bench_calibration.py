"""The calibration benchmarks of the relevance floor, the grams index and
the int8 embedder (tests/bench/floor_calibration.py, grams_cost.py,
embedder_reference.py) run at a tiny size and write figures that agree with
each other."""

from __future__ import annotations

import os

import pytest
from bench import embedder_reference, floor_calibration
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


def test_the_embedder_reference_benchmark_compares_int8_with_fp32(tmp_path):
    if not embedder_reference.DEFAULT_WHEEL.is_file():  # as tests/unit/test_embedder_reference.py: CI must have it
        message = f"no reference wheel at {embedder_reference.DEFAULT_WHEEL} (infra/dev.sh setup downloads it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    data = tiny_locomo(tmp_path / "locomo.json")
    result = run_bench("embedder_reference", "--n", "8", "--data", str(data), out=tmp_path / "embedder.json")

    assert result["n"] == 8 and 0 < result["tokens_mean"] <= result["tokens_max"]
    assert result["cosine_min"] <= result["cosine_median"] <= 1.0001
    assert result["cosine_min"] >= embedder_reference.MIN_COSINE and result["pass"] is True
    assert result["batched_vs_one_at_a_time_max_abs"] < 1e-5
    assert all(ms > 0 for ms in result["ms_per_text"].values())
