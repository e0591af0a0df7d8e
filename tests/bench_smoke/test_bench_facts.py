"""tests/bench/facts.py derives facts from a tiny LoCoMo-shaped conversation
(against a scripted endpoint that makes every turn a fact, so the run takes
seconds) and reports fact, turn and union recall, the derivation's cost and
the appends' latency with and without the fact worker."""

from __future__ import annotations

import pytest
from bench import locomo
from bench_runs import run_bench, tiny_locomo
from fakes import FactBrain

pytestmark = pytest.mark.timeout(300)


def test_the_facts_benchmark_scores_facts_turns_and_both(tmp_path, monkeypatch):
    data = tiny_locomo(tmp_path / "locomo.json")
    (conv,) = locomo.load(data)
    brain = FactBrain(echo=True)
    monkeypatch.setenv("MEMQ_FACTS__LLM__BASE_URL", brain.url)
    monkeypatch.setenv("MEMQ_FACTS__LLM__MODEL", "brain")
    try:
        out = run_bench("facts", "--data", str(data), "--sessions", "2", out=tmp_path / "facts.json")
    finally:
        brain.close()
    r = out["result"]
    assert r["model"] == "brain" and r["events"] == len(conv.turns)
    assert r["llm_calls"] >= 1 and brain.calls == r["llm_calls"] and r["dead_lettered"] == 0
    assert r["facts"] >= 1 and r["seconds_per_event"] > 0
    for phase in ("without", "during"):
        assert 0 < r["append_ms"][phase]["p50"] <= r["append_ms"][phase]["p90"]
    overall = r["recall"]["overall"]
    assert overall["n"] == sum(1 for q in conv.questions if q.category in locomo.SCORED and q.evidence)
    assert overall["facts"] > 0  # every user turn is a fact: their sources are evidence
    assert max(overall["facts"], overall["turns"]) <= overall["union"] <= 1
