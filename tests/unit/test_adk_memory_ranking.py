"""MemqMemoryService's "adk" ranking: most query words first, then the order of addition."""

from __future__ import annotations

import unicodedata

from memq.contracts.adapters.adk import by_words_matched
from memq.contracts.queries import SearchResult


def result(text: str, seq: int, ts: float = 1.0, score: float = 0.0) -> SearchResult:
    return SearchResult(
        session_id="s",
        event_id=f"e{seq}",
        content=text,
        author="user",
        timestamp=ts,
        score=score,
        metadata={"seq": seq},
    )


def test_most_words_matched_first_then_the_order_of_addition():
    # memq's scores put "Ready." second (its indexed text holds the turn before it); ADK counts words.
    found = [result("The deploy status is ready.", 3, score=0.9), result("Ready.", 2, score=0.8)]
    found.append(result("The deploy is ready.", 1, score=0.7))
    ranked = by_words_matched("deploy status ready", found)
    assert [r.content for r in ranked] == ["The deploy status is ready.", "The deploy is ready.", "Ready."]
    ties = [result(f"note {i} about work", i, score=1 - i / 100) for i in (13, 2, 0)]
    assert [r.event_id for r in by_words_matched("work note", ties)] == ["e0", "e2", "e13"]


def test_unspaced_words_match_inside_and_forms_are_normalised():
    found = [result("I like tea", 1), result(unicodedata.normalize("NFD", "私の名前は太郎です"), 2)]
    assert by_words_matched("太郎", found)[0].event_id == "e2"
    assert by_words_matched("thon", [result("Python", 1)])[0].content == "Python"  # kept, just not lifted
