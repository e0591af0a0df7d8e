"""The offline extractive summarizer (workers/memory/extractive.py)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq.workers.memory.extractive import ELLIPSIS, Turn, score, split_sentences, summarize
from memq.workers.memory.tokens import count_text

LOCOMO = Path("/work/shared/data/locomo/locomo-dev4.json")
MAY_8 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()
DAY = 86400.0
LINE = re.compile(r"^(?:\[\d{4}-\d{2}-\d{2}\] )?[^:]+: .+$")

FACT = "On 8 May 2023 Caroline adopted two dogs named Max and Luna."
CHIT_CHAT = ["Hi!", "Thanks!", "lol", "Haha, so true.", "How are you?", "Wow, that's cool!"]


def body(line: str) -> str:
    return line.split(": ", 1)[1]


# --- budget ------------------------------------------------------------------------

WORDS = st.sampled_from(
    "I my Caroline Paris Dr. e.g. the a went will adopted 2023 12/05/2023 May Monday yesterday three "
    "42 lol hi? ok! … 🙂 日本 naïve <|endoftext|> : [x] - \n".split(" ")
) | st.text(max_size=12)
SENTENCES = st.lists(WORDS, max_size=30).map(" ".join) | st.lists(WORDS, min_size=60, max_size=400).map(" ".join)
TURNS = st.lists(
    st.builds(
        Turn,
        author=st.sampled_from(["Caroline", "Melanie", "user", "a: b", ""]) | st.text(max_size=10),
        text=st.lists(SENTENCES, max_size=4).map(". ".join),
        timestamp=st.none() | st.floats(min_value=-1e10, max_value=1e10) | st.just(float("inf")),
    ),
    max_size=8,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=TURNS, previous=st.none() | SENTENCES | st.text(max_size=200), target=st.integers(1, 50))
def test_summary_stays_within_target(turns, previous, target):
    summary = summarize(turns, previous=previous, target_tokens=target)
    assert count_text(summary) <= target
    assert summary == summarize(turns, previous=previous, target_tokens=target)  # deterministic
    assert count_text(summarize([], previous=summary, target_tokens=target)) <= target


@settings(max_examples=30, deadline=None)
@given(turns=TURNS, target=st.integers(20, 300), model=st.sampled_from([None, "gpt-4", "gpt-4o"]))
def test_within_larger_targets_and_other_models(turns, target, model):
    assert count_text(summarize(turns, target_tokens=target, model=model), model) <= target


def test_a_sentence_longer_than_the_target_is_cut_at_a_word_boundary():
    long = "Caroline adopted " + " ".join(f"dog{i}" for i in range(500)) + "."
    summary = summarize([Turn("Melanie", long, MAY_8)], target_tokens=30)
    assert summary.startswith("[2023-05-08] Melanie: Caroline adopted dog0 dog1")
    assert summary.endswith(ELLIPSIS) and count_text(summary) <= 30
    assert re.search(r" dog\d+…$", summary)  # whole words only
    assert summarize([Turn("Melanie", long, MAY_8)], target_tokens=1) == ""  # no word fits with "…"


# --- what is kept --------------------------------------------------------------------


def test_keeps_the_fact_over_chit_chat_when_only_one_fits():
    turns = [Turn("Melanie", c, MAY_8 + i) for i, c in enumerate(CHIT_CHAT)]
    turns.insert(2, Turn("Caroline", FACT, MAY_8 + 2.5))
    one_line = count_text(f"[2023-05-08] Caroline: {FACT}")
    assert summarize(turns, target_tokens=one_line + 3) == f"[2023-05-08] Caroline: {FACT}"


def test_scores_rank_facts_above_chit_chat_and_questions():
    assert all(score(FACT) > score(c) for c in CHIT_CHAT)
    assert score("I bought a house in Lisbon last March.") > score("Did you buy a house in Lisbon last March?")
    assert score("Hey Mel!") <= 0 and score("lol") <= 0
    assert score("I totally agree, Melanie.") < score("I met Melanie there.")  # a vocative is no fact


def test_chit_chat_alone_makes_an_empty_summary():
    assert summarize([Turn("a", c) for c in CHIT_CHAT], target_tokens=500) == ""


def test_duplicates_are_kept_once():
    turns = [Turn("Caroline", FACT, MAY_8), Turn("Melanie", FACT.upper().replace(".", "!"), MAY_8 + DAY)]
    assert summarize(turns, target_tokens=500) == f"[2023-05-08] Caroline: {FACT}"


def test_ties_go_to_the_newer_sentence():
    turns = [Turn("A", "I adopted a dog named Rex."), Turn("B", "I adopted a cat named Tom.")]
    assert summarize(turns, target_tokens=count_text("B: I adopted a cat named Tom.") + 1) == (
        "B: I adopted a cat named Tom."
    )


# --- format ----------------------------------------------------------------------------


def test_prefix_format_and_chronological_order():
    texts = ["Hi!", FACT, "I will start at Google on Monday.", "lol", "We moved to Berlin in 2021.", "ok"]
    turns = [Turn("Caroline" if i % 2 else "Melanie", t, MAY_8 + i * DAY) for i, t in enumerate(texts)]
    turns.append(Turn("Bot", "I booked 3 tickets for Friday."))  # no timestamp: no date
    lines = summarize(turns, target_tokens=500).splitlines()
    assert lines == [
        f"[2023-05-09] Caroline: {FACT}",
        "[2023-05-10] Melanie: I will start at Google on Monday.",
        "[2023-05-12] Melanie: We moved to Berlin in 2021.",
        "Bot: I booked 3 tickets for Friday.",
    ]
    # Tight budget: fewer lines, still in input order and in the same format.
    tight = summarize(turns, target_tokens=45).splitlines()
    assert 1 <= len(tight) < len(lines) and tight == [line for line in lines if line in tight]
    assert all(LINE.match(line) for line in tight)


def test_one_sentence_per_line():
    turn = Turn(
        "Caroline", "I met Dr. Smith on Monday, e.g. at 9am.  I adopted Max in 2020! Did you?\nI will call Bob."
    )
    assert summarize([turn], target_tokens=500).splitlines() == [
        "Caroline: I met Dr. Smith on Monday, e.g. at 9am.",
        "Caroline: I adopted Max in 2020!",
        "Caroline: I will call Bob.",
    ]


def test_split_sentences():
    assert split_sentences("  Hi!  How are you?I'm fine. Mr. J. Doe came. ") == [
        "Hi!",
        "How are you?I'm fine.",
        "Mr. J. Doe came.",
    ]
    assert split_sentences('He said "go." Then left.\n\n- item') == ['He said "go."', "Then left.", "- item"]
    assert split_sentences(" \n\t ") == []


# --- folding -------------------------------------------------------------------------


def test_hierarchical_folding_keeps_the_strongest_old_fact():
    a = [Turn("Melanie", "Hi!", MAY_8), Turn("Caroline", FACT, MAY_8 + 1), Turn("Melanie", "Nice.", MAY_8 + 2)]
    s1 = summarize(a, target_tokens=60)
    assert s1 == f"[2023-05-08] Caroline: {FACT}"
    b = [Turn("Melanie", "We talked about the weather for a while.", MAY_8 + DAY), Turn("Caroline", "lol yes.")]
    s2 = summarize(b, previous=s1, target_tokens=count_text(s1) + 2)
    assert s2 == s1  # the old fact outscores the new filler
    # With room for both, the old line comes first (it is older).
    s3 = summarize(b, previous=s1, target_tokens=200)
    assert s3.splitlines()[0] == s1 and len(s3.splitlines()) == 2


def test_a_summary_that_fits_is_kept_as_is():
    turns = [Turn("Caroline", FACT, MAY_8), Turn("Melanie", "I will move to Berlin next month.", MAY_8 + DAY)]
    summary = summarize(turns, target_tokens=200)
    assert summarize([], previous=summary, target_tokens=200) == summary


def test_repeated_folding_stays_within_target_and_keeps_the_best_facts():
    target = 80
    summary = ""
    for i in range(20):
        when = MAY_8 + i * DAY
        turns = [
            Turn("Melanie", f"Haha yes, so cool {i}!", when),
            Turn("Caroline", "That sounds like fun.", when),
            Turn("Melanie", "I went to the park.", when),
        ]
        if i == 3:
            turns.append(Turn("Caroline", FACT, when))
        summary = summarize(turns, previous=summary, target_tokens=target)
        assert 0 < count_text(summary) <= target
    assert f"[2023-05-11] Caroline: {FACT}" in summary.splitlines()  # folded 16 more times and still there
    # A repeated sentence is kept once, with its first date.
    assert summary.count("That sounds like fun.") == 1 and "[2023-05-08] Caroline: That sounds like fun." in summary


def test_previous_only_is_trimmed_to_target():
    turns = [Turn("Caroline", f"I adopted dog number {i} on Monday.", MAY_8 + i * DAY) for i in range(30)]
    summary = summarize(turns, target_tokens=1000)
    assert len(summary.splitlines()) == 30
    trimmed = summarize([], previous=summary, target_tokens=50)
    assert 0 < count_text(trimmed) <= 50
    assert set(trimmed.splitlines()) < set(summary.splitlines())
    assert summarize([], previous=None, target_tokens=50) == "" == summarize([], previous=" \n", target_tokens=5)


def test_previous_summary_written_by_an_llm():
    llm = (
        "## Summary\n"
        "Caroline and Melanie caught up. Caroline went to an LGBTQ support group on 7 May 2023 and plans to "
        "study counseling.\n"
        "- Melanie has three kids and painted a sunrise in 2022.\n"
        "* They chatted about the weather, e.g. the rain.\n"
    )
    turns = [Turn("Caroline", "I signed up for a pottery class on Friday.", MAY_8)]
    lines = summarize(turns, previous=llm, target_tokens=500).splitlines()
    assert lines == [
        "Caroline and Melanie caught up.",
        "Caroline went to an LGBTQ support group on 7 May 2023 and plans to study counseling.",
        "Melanie has three kids and painted a sunrise in 2022.",
        "They chatted about the weather, e.g. the rain.",
        "[2023-05-08] Caroline: I signed up for a pottery class on Friday.",
    ]
    tight = summarize(turns, previous=llm, target_tokens=40).splitlines()
    assert "Caroline went to an LGBTQ support group on 7 May 2023 and plans to study counseling." in tight


def test_previous_lines_keep_their_author_and_date():
    previous = "[2023-05-01] Melanie: I booked a flight to Rome for June 3. Then I adopted a cat named Oscar.\nBot: ok"
    lines = summarize([], previous=previous, target_tokens=500).splitlines()
    assert lines == [
        "[2023-05-01] Melanie: I booked a flight to Rome for June 3.",
        "[2023-05-01] Melanie: Then I adopted a cat named Oscar.",
    ]


def test_empty_input():
    assert summarize([], target_tokens=100) == ""
    assert summarize([Turn("a", ""), Turn("b", "   \n ")], target_tokens=100) == ""


# --- real data -------------------------------------------------------------------------


def locomo_turns(limit: int) -> list[Turn]:
    conversation = json.loads(LOCOMO.read_text())[0]["conversation"]
    turns: list[Turn] = []
    n = 1
    while f"session_{n}" in conversation:
        when = datetime.strptime(conversation[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y")
        stamp = when.replace(tzinfo=UTC).timestamp()
        turns += [Turn(t["speaker"], t["text"], stamp) for t in conversation[f"session_{n}"]]
        n += 1
    return turns[:limit]


@pytest.mark.skipif(not LOCOMO.is_file(), reason="LoCoMo dev data not present")
def test_locomo_conversation_keeps_names():
    turns = locomo_turns(60)
    summary = summarize(turns, target_tokens=300)
    assert 0 < count_text(summary) <= 300
    lines = summary.splitlines()
    assert len(lines) >= 5 and all(LINE.match(line) for line in lines)
    names = {
        word
        for t in turns
        for sentence in split_sentences(t.text)
        for word in re.findall(r"[A-Z][\w'-]+", sentence)[1:]
        if word not in ("I", "I'm", "I've", "I'd", "I'll")
    }
    kept = {name for name in names if any(re.search(rf"\b{re.escape(name)}\b", body(line)) for line in lines)}
    # The first 60 turns name few things besides the two speakers (LGBTQ, Mel, ...).
    assert kept, (names, summary)
    assert {line.split("]")[0] for line in lines} >= {"[2023-05-08", "[2023-06-09"}  # several sessions
