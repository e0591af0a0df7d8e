"""tests/bench/retrieval.py runs on a tiny LoCoMo-shaped conversation against
the embedded index, with each offline embedder, and reports turn-level and
session-level recalls in [0, 1] for every mode and category, over every
question and every turn of the file; with ``--rerank``, the rows of every
second stage (e5, the sparse head, both, the sparse head fused, an LLM's
order from a scripted endpoint) at each weight, held to the same checks."""

from __future__ import annotations

import json
import re

import pytest
from bench import locomo
from bench.retrieval import STAGES
from bench_runs import run_bench, tiny_locomo
from fakes import ChatStub, completion

pytestmark = pytest.mark.timeout(180)


class Ranker:
    """An LLM reranker by rule: the passages that share a word with the
    question, the most words first; its first reply is not JSON."""

    def __init__(self) -> None:
        self.calls = self.empty = 0

    def __call__(self, body: dict) -> tuple[int, dict, object]:
        self.calls += 1
        if self.calls == 1:
            return 200, {}, completion("the best ones are 1 and 2")
        prompt = body["messages"][-1]["content"]
        question = words(prompt.split("\n", 1)[0])
        passages = re.findall(r"^\[(\d+)\] (.*)$", prompt, re.M)
        shared = sorted(((len(question & words(t)), int(i)) for i, t in passages), reverse=True)
        relevant = [i for n, i in shared if n]
        self.empty += not relevant
        return 200, {}, completion(json.dumps({"relevant": relevant}))


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_the_retrieval_benchmark_indexes_every_turn_and_scores_every_question(tmp_path, monkeypatch):
    data = tiny_locomo(tmp_path / "locomo.json", sessions=1)  # 12 turns, a question of each category
    (conv,) = locomo.load(data)
    ranker = Ranker()
    stub = ChatStub(ranker)
    monkeypatch.setenv("MEMQ_FACTS__LLM__BASE_URL", stub.url)
    monkeypatch.setenv("MEMQ_FACTS__LLM__MODEL", "ranker")
    result = run_bench(
        "retrieval",
        *("--data", str(data), "--quick", "--backends", "embedded", "--embedders", "local", "e5", "--lean"),
        *("--rerank", "5", "--rerank-weights", "0", "0.5", "--rerank-stage", *STAGES),
        out=tmp_path / "r.json",
    )

    assert result["mode"] == "quick" and result["raw_embedder_per_s"] > 0
    assert list(result["embedders"]) == ["local", "e5"]
    for kind, e in result["embedders"].items():
        assert e["per_s"] > 0 and e["per_s_one_thread"] > 0 and 50 < e["rss_mb"] < 2000, (kind, e)
    runs = result["results"]
    assert [(r["backend"], r["embedder"]) for r in runs] == [("embedded", "local"), ("embedded", "e5")]
    assert runs[1]["model"] == "local:multilingual-e5-small-q4"
    scored = [q for q in conv.questions if q.category in locomo.SCORED]
    for run in runs:
        assert run["events"] == len(conv.turns) and run["events_per_s"] > 0
        assert list(run["rerank"]) == list(STAGES)
        for stage in STAGES:
            assert {f"rerank {stage} w0 (top 5)", f"rerank {stage} w0.5 (top 5)"} <= set(run["recall"]), stage
            assert run["rerank"][stage]["added_p50_ms_warm"] > 0, stage
        assert run["questions"]["overall"] == len(scored) == run["floor"]["questions"]
        llm = run["rerank"]["llm"]
        assert llm["model"] == "ranker" and llm["calls"] == len(conv.questions)
        assert sum(n for cat, n in run["questions"].items() if cat != "overall") == len(scored)
        for level, baseline in (("recall", "recall"), ("session_recall", "session_recall")):
            tables = {"baseline": result["baseline"][baseline], **run[level]}
            assert {"keyword", "vector", "hybrid"} <= set(tables)
            for mode, by_category in tables.items():
                assert set(by_category) == set(run["questions"]), (level, mode)
                for category, at_k in by_category.items():
                    assert set(at_k) == {"5", "10"} and all(0 <= r <= 1 for r in at_k.values()), (mode, category)
                    assert at_k["5"] <= at_k["10"], (level, mode, category)  # the top 5 are among the top 10
        # a question's evidence is one turn: found it, found its session
        for mode, by_category in run["recall"].items():
            for category, at_k in by_category.items():
                assert all(run["session_recall"][mode][category][k] >= r for k, r in at_k.items()), (mode, category)
        # one turn per question names its topic: keyword search cannot miss it
        assert run["recall"]["keyword"]["overall"]["10"] == 1.0
    stub.close()
    assert [r["rerank"]["llm"]["invalid_replies"] for r in runs] == [1, 0]  # the first reply was not JSON
    assert sum(r["rerank"]["llm"]["empty_replies"] for r in runs) == ranker.empty
