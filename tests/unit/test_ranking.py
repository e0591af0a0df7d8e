"""How a search's candidates are ranked: who the question names, and when it asks."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from memq.workers.memory.dates import named_periods
from memq.workers.memory.recall import (
    PREVIOUS_CHARS,
    Doc,
    Hit,
    Ranking,
    Turn,
    asks_when,
    in_order,
    named_authors,
    neighbour_scores,
    previous_turn,
    question_share,
    rank,
    relates,
    search_text,
    states_time,
    without_names,
)
from memq.workers.query.search import ranking_of
from memq.workers.settings import RecallSettings


def hit(id_: str, score: float, author: str = "Caroline", text: str = "hello") -> Hit:
    doc = Doc(id_, "a", "u", "s", 1, author, "user", 0.0, text, text)
    return Hit(doc, score, {"hybrid": score})


def test_names_are_found_as_whole_words_in_any_case_and_possessive():
    authors = {"Caroline", "Melanie", "Jon Snow", "al", "user"}
    assert named_authors("What did caroline research?", authors) == ("Caroline",)
    assert named_authors("What do Melanie's kids like?", authors) == ("Melanie",)
    assert named_authors("Where does jon snow live?", authors) == ("Jon Snow",)
    assert named_authors("Did Carolines cat eat?", authors) == ()  # not a word of its own
    assert named_authors("What did the user and Melanie say?", authors) == ("Melanie", "user")
    assert named_authors("all of it", authors) == ()  # "al" is only part of a word


def test_names_are_removed_with_their_possessive():
    assert without_names("What do Melanie's kids like?", ["Melanie"]) == "What do kids like?"
    assert without_names("What did CAROLINE research?", ["Caroline"]) == "What did research?"
    assert without_names("Melanie", ["Melanie"]) == ""


def test_when_questions_and_time_stating_turns():
    assert asks_when("When did Caroline go to the support group?")
    assert asks_when("How long has Caroline had her friends?")
    assert asks_when("What year did Jon move?")
    assert not asks_when("What did Caroline do when she was young?")
    assert states_time("I went to a support group yesterday")
    assert states_time("A friend made it ten years ago")
    assert states_time("We moved in May 2021")
    assert not states_time("It was so powerful")


def test_a_named_author_and_a_time_lift_a_doc_over_a_better_plain_score():
    general = [
        hit("other", 0.9, author="Melanie"),
        hit("hers", 0.7),
        hit("dated", 0.65, author="Melanie", text="I ran it last Saturday"),
    ]
    ranked = rank(general, named=("Caroline",), when=True, k=3, ranking=Ranking(0.3, 0.3, 1.0))
    assert [h.doc.id for h in ranked] == ["hers", "dated", "other"]
    assert ranked[0].score == 1.0 and ranked[0].scores["ranked"] == 1.0 and ranked[0].scores["hybrid"] == 0.7


def test_without_names_or_when_the_general_order_stands():
    general = [hit("b", 0.5), hit("a", 0.9), hit("c", 0.1)]
    assert [h.doc.id for h in rank(general, k=2)] == ["a", "b"]


def test_a_doc_found_by_both_searches_keeps_its_better_score():
    general = [hit("x", 0.2), hit("y", 0.6)]
    by_author = [hit("x", 0.9)]
    ranked = rank(general, by_author, named=("Caroline",), k=5, ranking=Ranking(0.0, 0.0, 1.2))
    assert [h.doc.id for h in ranked] == ["x", "y"]
    assert abs(ranked[0].score - 1.08) < 1e-9


def test_raw_scores_are_normalised_per_search_when_asked():
    # BM25 scores of 12 and 3 must not swamp a 0.3 boost.
    general = [hit("strong", 12.0, author="Melanie"), hit("weak", 3.0, author="Melanie"), hit("hers", 4.0)]
    ranked = rank(general, named=("Caroline",), k=3, ranking=Ranking(0.3, 0.0, 1.0), normalise=True)
    assert [h.doc.id for h in ranked] == ["strong", "hers", "weak"]
    assert [round(h.score, 3) for h in ranked] == [1.0, round(1 / 9 + 0.3, 3), 0.0]


@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 1)), max_size=8),
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 1)), max_size=8),
    st.integers(1, 10),
)
def test_rank_returns_at_most_k_distinct_docs_best_first(general, by_author, k):
    ranked = rank(
        [hit(i, s) for i, s in general], [hit(i, s) for i, s in by_author], named=("Caroline",), when=True, k=k
    )
    ids = [h.doc.id for h in ranked]
    assert len(ids) == len(set(ids)) <= k
    assert ids == [h.doc.id for h in sorted(ranked, key=lambda h: (-h.score, h.doc.session, h.doc.id))]
    assert set(ids) <= {i for i, _ in general} | {i for i, _ in by_author}


def test_a_hit_relates_by_a_keyword_match_or_a_close_enough_vector():
    doc = hit("a", 1.0).doc
    assert relates(Hit(doc, 3.2, {"keyword": 3.2}), 0.4)
    assert relates(Hit(doc, 0.5, {"vector": 0.5}), 0.4)
    assert not relates(Hit(doc, 0.3, {"vector": 0.3}), 0.4)
    assert relates(Hit(doc, 0.2, {"hybrid": 0.2, "keyword": 1.5, "vector": 0.1}), 0.4)  # hybrid: either side
    assert not relates(Hit(doc, 0.0, {"hybrid": 0.0, "vector": 0.39}), 0.4)
    assert relates(Hit(doc, 0.0, {"hybrid": 0.0, "vector": 0.39}), -1.0)  # -1: no floor


def test_equal_scores_keep_the_order_the_memories_were_made_in():
    def made(id_: str, score: float, ts: float, session: str, seq: int) -> Hit:
        return Hit(Doc(id_, "a", "u", session, seq, "user", "user", ts, "t", "t"), score)

    hits = [
        made("d", 1.0, 5.0, "s1", 10),
        made("c", 1.0, 5.0, "s1", 2),
        made("b", 1.0, 1.0, "s9", 1),
        made("a", 2.0, 9.0, "s1", 1),
    ]
    assert [h.doc.id for h in in_order(hits)] == ["a", "b", "c", "d"]  # seq 2 before seq 10, not "10" < "2"


def test_a_named_author_keeps_the_best_matches_of_the_others():
    # A trap question names Caroline for what Melanie said: Melanie's best
    # match stays in the top k even though every boosted Caroline turn outscores it.
    general = [hit(f"c{i}", 0.9 - i / 100, "Caroline") for i in range(5)] + [hit("m0", 0.5, "Melanie")]
    plain = rank(general, named=("Caroline",), k=3)
    assert "m0" not in [h.doc.id for h in plain]
    kept = rank(general, named=("Caroline",), k=3, ranking=Ranking(others_kept=1))
    assert [h.doc.id for h in kept] == ["c0", "c1", "m0"]
    assert [h.doc.id for h in rank(general, k=3, ranking=Ranking(others_kept=1))] == ["c0", "c1", "c2"]  # no name


def test_by_default_neighbours_not_kept_matches_lift_the_other_speakers_turns():
    # A trap question names Caroline for what Melanie said next to her. The
    # default lifts Melanie's turn after Caroline's best match (neighbour
    # propagation), not her best match elsewhere (others_kept 0): on LoCoMo
    # dev that kept adversarial recall above the plain baseline and lost less
    # of the named speaker's own evidence (docs/benchmarks/index.md).
    ranking = ranking_of(RecallSettings())
    c0 = turn("c0", 0.6, "I painted the lake.", None)
    general = [
        c0,
        turn("c1", 0.5, "Lakes are calm.", None, session="s1"),
        turn("m-far", 0.55, "I love lakes.", None, session="s2", author="Melanie"),
        turn("m-next", 0.45, "Wow, it is lovely!", Turn("Caroline", "I painted the lake."), author="Melanie"),
    ]
    top = rank(general, named=("Caroline",), k=3, ranking=ranking)
    assert [h.doc.id for h in top] == ["c0", "c1", "m-next"]


def test_a_doc_written_in_a_period_the_query_names_is_lifted():
    may_9 = datetime(2023, 5, 9, 14, tzinfo=UTC).timestamp()
    general = [hit("plain", 0.6), replace(hit("dated", 0.5), doc=replace(hit("dated", 0.5).doc, timestamp=may_9))]
    periods = named_periods("What did Caroline paint on 9 May, 2023?")
    assert [h.doc.id for h in rank(general, periods=periods, k=2)] == ["dated", "plain"]
    assert rank(general, periods=periods, k=2)[0].score == 0.5 + Ranking().date_boost
    assert [h.doc.id for h in rank(general, periods=named_periods("in June 2023"), k=2)] == ["plain", "dated"]
    assert [h.doc.id for h in rank(general, k=2)] == ["plain", "dated"]


def test_the_share_of_a_turns_words_in_questions():
    assert question_share("What's your favourite game?") == 1.0
    assert question_share("I won the tournament yesterday. Did you watch?") == 3 / 8
    assert question_share("I won the tournament yesterday!") == 0.0
    assert question_share("你好吗？我很好。") == 0.5  # full-width marks end sentences too
    assert question_share("") == 0.0


def test_a_turn_that_only_asks_yields_to_one_that_states():
    general = [hit("asks", 0.7, text="Which game do you like best?"), hit("states", 0.6, text="I love Xenoblade.")]
    assert [h.doc.id for h in rank(general, k=2)] == ["states", "asks"]
    assert rank(general, k=2)[1].score == 0.7 - Ranking().question_penalty
    assert [h.doc.id for h in rank(general, k=2, ranking=Ranking(question_penalty=0.0))] == ["asks", "states"]


def turn(id_: str, score: float, text: str, previous: Turn | None, session: str = "s", author: str = "Caroline") -> Hit:
    doc = Doc(id_, "a", "u", session, 1, author, "user", 0.0, text, search_text(author, text, 0.0, previous))
    return Hit(doc, score, {"hybrid": score})


def test_a_docs_searchable_text_names_its_previous_turn():
    assert previous_turn(search_text("Caroline", "A sunset.", 0.0, Turn("Melanie", "What: did you paint?"))) == Turn(
        "Melanie", "What: did you paint?"
    )
    assert previous_turn(search_text("Caroline", "A sunset.", 0.0)) is None  # a session's first turn
    long = "x" * (PREVIOUS_CHARS + 10)
    assert previous_turn(search_text("Caroline", "Yes.", None, Turn("Melanie", long))) == Turn(
        "Melanie", long[:PREVIOUS_CHARS]
    )


def test_a_turn_next_to_a_strong_match_gains_from_it():
    # The question's words sit in Melanie's question; the answer is the turn after it.
    asked = turn("asked", 0.9, "Did you paint the lake?", None, author="Melanie")
    answer = turn("answer", 0.3, "Yes, last May!", Turn("Melanie", "Did you paint the lake?"))
    other = turn("other", 0.4, "I like tea.", None, session="s2")
    elsewhere = turn("elsewhere", 0.1, "Yes, last May!", Turn("Melanie", "Did you paint the lake?"), session="s3")
    gained = neighbour_scores({h.doc.id: (h.score, h.doc) for h in (asked, answer, other, elsewhere)})
    assert gained == {"asked": 0.3, "answer": 0.9}  # both ways; a same text in another session is no neighbour
    ranking = Ranking(question_penalty=0.0, neighbour_weight=0.2)
    ranked = rank([asked, answer, other, elsewhere], k=4, ranking=ranking)
    assert [h.doc.id for h in ranked] == ["asked", "answer", "other", "elsewhere"]
    assert abs(ranked[0].score - (0.9 + 0.2 * 0.3)) < 1e-9 and abs(ranked[1].score - (0.3 + 0.2 * 0.9)) < 1e-9
    off = rank([asked, answer, other, elsewhere], k=4, ranking=Ranking(question_penalty=0.0))
    assert [h.doc.id for h in off] == ["asked", "other", "answer", "elsewhere"]
