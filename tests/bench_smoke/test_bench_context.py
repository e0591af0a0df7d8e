"""tests/bench/context.py and tests/bench/context_split.py replay a tiny
LoCoMo-shaped conversation through real workers and report, per
configuration, evidence fractions that add up over the questions asked and
contexts within the budget."""

from __future__ import annotations

import pytest
from bench import locomo
from bench_runs import run_bench, run_bench_output, tiny_locomo

pytestmark = pytest.mark.timeout(300)

BUDGET = 400  # tokens: the tiny conversation is longer, so summaries and windows must cut
CONFIGS = ["buffer_window", "token_window", "summary_buffer + extractive"]  # the LLM one needs a model server


def test_the_context_benchmark_scores_every_question_within_the_budget(tmp_path):
    data = tiny_locomo(tmp_path / "locomo.json")
    (conv,) = locomo.load(data)
    scored = [q for q in conv.questions if q.category in locomo.SCORED]
    args = ["--data", str(data), "--quick", "--budget", str(BUDGET), "--configs", *CONFIGS]
    result = run_bench("context", *args, out=tmp_path / "context.json")

    assert result["budget"] == BUDGET and [r["config"] for r in result["results"]] == CONFIGS
    for r in result["results"]:
        name, asked, held = r["config"], r["questions"], r["evidence"]
        assert r["skipped"] is None, name
        assert asked["overall"] == len(scored) == sum(n for cat, n in asked.items() if cat != "overall"), name
        assert set(held) == set(asked) and all(0 <= f <= 1 for f in held.values()), name
        # "overall" is the mean over questions: its categories weighted by their counts
        weighted = sum(held[cat] * n for cat, n in asked.items() if cat != "overall") / asked["overall"]
        assert held["overall"] == pytest.approx(weighted), name
        assert 0 < r["tokens_mean"] <= r["tokens_max"], name
    by_name = {r["config"]: r for r in result["results"]}
    for name in ("token_window", "summary_buffer + extractive"):  # these two keep to the budget
        assert by_name[name]["over_budget"] == 0 and by_name[name]["tokens_max"] <= BUDGET, name
    assert by_name["summary_buffer + extractive"]["checkpoints"] >= 1  # the conversation outgrew the budget


def test_the_split_benchmark_captures_every_question_and_sweeps_within_the_budget(tmp_path):
    data = tiny_locomo(tmp_path / "locomo.json")
    (conv,) = locomo.load(data)
    inputs = tmp_path / "split.pkl"
    run_bench_output(
        "context_split", "capture", "--data", str(data), "--quick", "--budget", str(BUDGET), "--out", str(inputs)
    )
    sweep = ["sweep", "--inputs", str(inputs), "--shares", "0.2", "0.5", "--limits", "5", "10"]
    result = run_bench("context_split", *sweep, out=tmp_path / "context_split.json")
    # capture pickles its cases as the program's own classes: the sweep, not a test, reads them
    scored = [q for q in conv.questions if q.category in locomo.SCORED]
    assert result["config"] == {"budget": BUDGET, "questions": len(scored), "conversations": 1, "tolerance": 0.0}
    policies = [(r["recall_share"], r["recall_limit"]) for r in result["rows"]]
    assert policies == [(0.2, 5), (0.2, 10), (0.5, 5), (0.5, 10)]
    for r in result["rows"]:
        assert isinstance(r["evidence"], float) and 0 <= r["evidence"] <= 1 and r["over_budget"] == 0, r
    # one conversation: no fold to leave out
    assert result["held_out"] == [] and result["leave_one_out_evidence"] is None
