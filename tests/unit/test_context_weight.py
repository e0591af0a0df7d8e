"""A turn's own words outrank its previous turn's (issue 40): how a doc's
searchable text splits, and the query worker's BM25 of memories not yet
indexed, which must rank them as the backends do (tests/integration/
test_index_contract.py checks both backends)."""

from __future__ import annotations

from memq.workers.memory.recall import CONTEXT_WEIGHT, Turn, previous_turn, search_text, split_search_text
from memq.workers.memory.unindexed import bm25


def test_a_search_text_splits_into_the_turn_and_its_context_and_joins_back():
    whole = search_text("ann", "Nice.", 1_700_000_000.0, Turn("bob", "I write Python (daily)"))
    own, context = split_search_text(whole)
    assert own + context == whole
    assert "Python" not in own and "Nice." in own
    assert context.startswith("\n(after bob: ") and previous_turn(whole) == Turn("bob", "I write Python (daily)")


def test_a_search_text_without_a_previous_turn_is_all_its_own():
    for text in (search_text("ann", "hello\n(after all", None), search_text("ann", "plain", None)):
        assert split_search_text(text) == (text, "")


def test_the_tail_bm25_weighs_the_previous_turn_below_the_turns_own_words():
    said, nice = ["i", "write", "python"], ["nice"]
    corpus = [said, nice + said]
    scores = bm25(["python"], [said, nice], corpus, total=2, context=[[], said])
    assert scores[0] > scores[1] > 0
    assert 0 < CONTEXT_WEIGHT < 1
    # without context, as before
    assert bm25(["python"], [said, nice], corpus, total=2)[1] == 0.0
