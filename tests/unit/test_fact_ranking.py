"""How a query ranks a user's facts (workers/query/facts.py: ranked): by
keyword, by vector over the floor, or both fused, as a search ranks memories."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from memq.workers.memory.facts import Fact, Source
from memq.workers.query.facts import _within_recall_time, ranked

FACTS = [
    Fact("a", "app", "u", "The user lives in Denver.", ("Denver",), (Source(1, "s", "e1", 10.0),), 10.0),
    Fact("b", "app", "u", "The user likes pottery.", ("pottery",), (Source(2, "s", "e2", 20.0),), 20.0),
    Fact("c", "app", "u", "The user likes jazz.", ("jazz",), (Source(3, "s", "e3", 30.0),), 30.0),
]


def ids(hits):
    return [f.id for f, _ in hits]


def test_keyword_keeps_the_facts_that_share_a_stem_best_first_then_newest():
    assert ids(ranked(FACTS, "pottery classes", 10)) == ["b"]
    assert ids(ranked(FACTS, "what does the user like?", 10)) == [
        "c",
        "b",
        "a",
    ]  # "like" ties b and c: the newest first
    assert ranked(FACTS, "ceramics", 10) == []
    assert ids(ranked(FACTS, "user", 1)) == ["c"]  # the limit


def test_vector_keeps_the_facts_whose_cosine_reaches_the_floor():
    hits = ranked(FACTS, "ceramics", 10, mode="vector", cosines=[0.1, 0.61, 0.2], floor=0.36)
    assert ids(hits) == ["b"] and hits[0][1] == 0.61
    assert ranked(FACTS, "ceramics", 10, mode="vector", cosines=[0.1, 0.2, 0.3], floor=0.36) == []


def test_hybrid_keeps_a_fact_found_either_way_and_fuses_the_scores():
    # "jazz" shares a stem with c only; the vectors find b (and c) by meaning
    hits = ranked(FACTS, "jazz", 10, mode="hybrid", cosines=[0.05, 0.5, 0.7], floor=0.36, alpha=0.5)
    assert ids(hits) == ["c", "b"]
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0  # best on both sides
    nothing = ranked(FACTS, "quantum chromodynamics", 10, mode="hybrid", cosines=[0.0, 0.1, 0.2], floor=0.36)
    assert nothing == []  # neither a shared stem nor a cosine over the floor


def test_without_cosines_every_mode_ranks_by_keyword():
    assert ids(ranked(FACTS, "pottery", 10, mode="hybrid")) == ids(ranked(FACTS, "pottery", 10)) == ["b"]


class SlowSearcher:
    """A query worker's searcher whose fact vectors take ``delay`` seconds."""

    def __init__(self, delay: float):
        self.delay, self.done = delay, False
        self.settings = SimpleNamespace(recall=SimpleNamespace(timeout_s=0.05, alpha=0.5))

    async def similarities(self, text, passages):
        await asyncio.sleep(self.delay)
        self.done = True  # the vectors are in the cache now
        return [0.9 if "pottery" in p else 0.0 for p in passages], 0.36, "test"


async def test_a_context_ranks_facts_by_meaning_unless_their_vectors_take_longer_than_a_recall():
    quick = SlowSearcher(0.0)
    assert ids(await _within_recall_time(FACTS, "ceramics", 5, SimpleNamespace(searcher=quick))) == ["b"]
    slow = SlowSearcher(0.2)
    assert await _within_recall_time(FACTS, "ceramics", 5, SimpleNamespace(searcher=slow)) == []  # keyword only
    assert not slow.done
    await asyncio.sleep(0.3)
    assert slow.done  # shielded: the vectors kept coming for the next context
