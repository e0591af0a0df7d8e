"""tests/bench/retrieval.py runs on a tiny LoCoMo-shaped conversation against
the embedded index and reports a recall in [0, 1] for every mode and
category, over every question and every turn of the file."""

from __future__ import annotations

import pytest
from bench import locomo
from bench_runs import run_bench, tiny_locomo

pytestmark = pytest.mark.timeout(180)


def test_the_retrieval_benchmark_indexes_every_turn_and_scores_every_question(tmp_path):
    data = tiny_locomo(tmp_path / "locomo.json", sessions=1)  # 12 turns, a question of each category
    (conv,) = locomo.load(data)
    result = run_bench("retrieval", "--data", str(data), "--quick", "--backends", "embedded", out=tmp_path / "r.json")

    assert result["mode"] == "quick" and result["raw_embedder_per_s"] > 0
    (run,) = result["results"]
    assert run["backend"] == "embedded" and run["events"] == len(conv.turns) and run["events_per_s"] > 0
    scored = [q for q in conv.questions if q.category in locomo.SCORED]
    assert run["questions"]["overall"] == len(scored) == run["floor"]["questions"]
    assert sum(n for cat, n in run["questions"].items() if cat != "overall") == len(scored)
    tables = {"baseline": result["baseline"]["recall"], **run["recall"]}
    assert {"keyword", "vector", "hybrid"} <= set(tables)
    for mode, by_category in tables.items():
        assert set(by_category) == set(run["questions"]), mode
        for category, at_k in by_category.items():
            assert set(at_k) == {"5", "10"} and all(0 <= r <= 1 for r in at_k.values()), (mode, category, at_k)
            assert at_k["5"] <= at_k["10"], (mode, category)  # the top 5 are among the top 10
    # one turn per question names its topic: keyword search cannot miss it
    assert run["recall"]["keyword"]["overall"]["10"] == 1.0
