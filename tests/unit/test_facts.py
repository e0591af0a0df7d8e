"""The fact bookkeeping of workers/memory/facts.py: ids, reconciliation,
history and forgetting, by example and by property (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.workers.memory.facts import (
    Candidate,
    Decision,
    DecisionRejected,
    Fact,
    Source,
    apply,
    fact_id,
    history,
    matching,
    normalise,
    predecide,
    reconcile,
    replay,
    scrub,
    sources_in_sessions,
    without_sources,
)

DAY = 86_400.0


def src(seq: int, session: str = "s1") -> Source:
    return Source(seq=seq, session=session, event_id=f"e{seq}", at=seq * DAY)


def cand(statement: str, *seqs: int, entities: tuple[str, ...] = (), user: str = "u", session: str = "s1") -> Candidate:
    return Candidate(
        app="a", user=user, statement=statement, entities=entities, sources=tuple(src(s, session) for s in seqs)
    )


def added(statement: str, *seqs: int, **kw) -> tuple[dict[str, Fact], Fact]:
    state, log = replay([(cand(statement, *seqs, **kw), Decision("add"))])
    return state, log[0].fact


# --- by example -----------------------------------------------------------------------


def test_normalise_ignores_case_spacing_and_punctuation():
    assert normalise("  Caroline LIKES   pottery. ") == normalise("caroline likes pottery") == "caroline likes pottery"
    assert normalise("Ｃａｆé!") == "café"  # NFKC: full-width letters


def test_ids_are_digests_of_user_statement_and_first_source():
    first = src(1)
    assert fact_id("a", "u", "Likes tea.", first) == fact_id("a", "u", "likes  TEA", first)
    assert len(fact_id("a", "u", "Likes tea.", first)) == 32
    others = {
        fact_id("a", "v", "Likes tea.", first),
        fact_id("b", "u", "Likes tea.", first),
        fact_id("a", "u", "Likes coffee.", first),
        fact_id("a", "u", "Likes tea.", src(2)),
        fact_id("a", "u", "Likes tea.", src(1, session="s2")),
    }
    assert fact_id("a", "u", "Likes tea.", first) not in others and len(others) == 5


def test_add_records_validity_sources_and_entities():
    state, fact = added(" Caroline lives in Boston. ", 3, 2, entities=("Boston", "boston ", " Caroline"))
    assert fact.statement == "Caroline lives in Boston."
    assert [s.seq for s in fact.sources] == [2, 3] and fact.valid_from == 2 * DAY
    assert fact.entities == ("Boston", "Caroline") and fact.current and fact.revision == 1
    assert state == {fact.id: fact}


def test_merge_appends_sources_and_keeps_the_statement():
    state, fact = added("Caroline lives in Boston.", 1, entities=("Boston",))
    changes = reconcile(
        state, cand("Caroline is based in Boston", 5, entities=("Caroline",)), Decision("merge", fact.id)
    )
    (change,) = changes
    assert change.kind == "merged" and change.fact.id == fact.id and change.fact.revision == 2
    assert change.fact.statement == fact.statement and [s.seq for s in change.fact.sources] == [1, 5]
    assert change.fact.entities == ("Boston", "Caroline")
    assert state[fact.id] == fact  # nothing overwritten in place


def test_invalidate_adds_the_new_fact_and_ends_the_old_one():
    state, old = added("Caroline lives in Boston.", 1)
    _, log = replay([(cand("Caroline moved to Denver.", 4), Decision("invalidate", invalidates=(old.id,)))], state)
    new, ended = log
    assert new.kind == "added" and ended.kind == "invalidated"
    assert ended.fact.invalid_from == 4 * DAY and ended.fact.invalidated_by == new.fact.id
    assert ended.fact.statement == old.statement and ended.fact.sources == old.sources
    assert history([*replay([(cand("Caroline lives in Boston.", 1), Decision("add"))])[1], *log], old.id) == [
        old,
        ended.fact,
    ]


def test_an_invalidation_never_ends_a_fact_before_it_began():
    state, old = added("Caroline lives in Boston.", 9)
    _, log = replay([(cand("Caroline moved to Denver.", 4), Decision("invalidate", invalidates=(old.id,)))], state)
    assert log[1].fact.invalid_from == old.valid_from


@pytest.mark.parametrize("action", ["merge", "invalidate"])
def test_unknown_foreign_or_invalid_targets_are_rejected(action):
    state, fact = added("Caroline lives in Boston.", 1)
    other, theirs = added("Mel paints.", 2, user="mel")

    def decide(id: str) -> Decision:
        return Decision("merge", id) if action == "merge" else Decision("invalidate", invalidates=(id,))

    with pytest.raises(DecisionRejected, match="no such fact"):
        reconcile(state, cand("x y", 3), decide("nope"))
    with pytest.raises(DecisionRejected, match="another user"):
        reconcile({**state, **other}, cand("x y", 3), decide(theirs.id))
    ended, _ = replay([(cand("Caroline moved.", 2), Decision("invalidate", invalidates=(fact.id,)))], state)
    with pytest.raises(DecisionRejected, match="invalid since"):
        reconcile(ended, cand("x y", 3), decide(fact.id))


def test_decisions_must_be_well_formed():
    with pytest.raises(ValueError):
        Decision("merge")
    with pytest.raises(ValueError):
        Decision("add", merge_into="f")
    with pytest.raises(ValueError):
        Decision("invalidate")
    with pytest.raises(ValueError):
        Decision("update")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cand("  ...  ", 1)
    with pytest.raises(ValueError):
        Candidate(app="a", user="u", statement="x", entities=(), sources=())


def test_none_and_redeliveries_change_nothing():
    state, fact = added("Caroline lives in Boston.", 1)
    assert reconcile(state, cand("hello", 2), Decision("none")) == []
    assert reconcile(state, cand("Caroline lives in Boston", 1), Decision("add")) == []
    merged, _ = replay([(cand("She lives in Boston", 2), Decision("merge", fact.id))], state)
    assert reconcile(merged, cand("She lives in Boston", 2), Decision("merge", fact.id)) == []
    # one turn, two facts: the second is not taken for a redelivery
    assert [c.kind for c in reconcile(state, cand("Caroline has a dog.", 1), Decision("add"))] == ["added"]


def test_predecide_merges_normalised_duplicates_only():
    state, fact = added("Caroline lives in Boston.", 1)
    assert predecide(state, cand("caroline lives in boston", 7)) == Decision("merge", fact.id)
    assert predecide(state, cand("Caroline lives in Denver", 7)) is None
    assert predecide(state, cand("caroline lives in boston", 7, user="v")) is None
    ended, _ = replay([(cand("Caroline moved.", 2), Decision("invalidate", invalidates=(fact.id,)))], state)
    assert predecide(ended, cand("Caroline lives in Boston", 7)) is None  # said again after it ended: the LLM decides


def test_matching_shows_facts_sharing_entities_or_words():
    steps = [
        (cand("Caroline lives in Boston.", 1, entities=("Caroline", "Boston")), Decision("add")),
        (cand("Melanie paints sunrises.", 2, entities=("Melanie",)), Decision("add")),
        (cand("Caroline lives in the lake house.", 3), Decision("add")),
        (cand("Jordan is from Denver.", 4, entities=("Jordan",), user="v"), Decision("add")),
    ]
    state, log = replay(steps)
    shown = matching(state, cand("Caroline now lives in Denver", 9, entities=("boston",)))
    assert [f.statement for f in shown] == ["Caroline lives in Boston.", "Caroline lives in the lake house."]
    assert matching(state, cand("Caroline now lives in Denver", 9, entities=("boston",)), limit=1) == shown[:1]
    assert matching(state, cand("Completely unrelated words", 9)) == []


def test_forgetting_removes_drops_and_restores():
    steps = [
        (cand("Caroline lives in Boston.", 1), Decision("add")),
        (cand("Caroline has a dog.", 2), Decision("add")),
    ]
    state, log = replay(steps)
    boston, dog = (c.fact for c in log)
    more, log2 = replay(
        [
            (cand("Caroline has a dog", 3), Decision("merge", dog.id)),
            (cand("Caroline moved to Denver.", 4), Decision("invalidate", invalidates=(boston.id,))),
        ],
        state,
    )
    denver = log2[1].fact
    changes = without_sources(more, {("s1", "e2"), ("s1", "e4")})
    assert [(c.kind, c.fact.id) for c in changes] == sorted(
        [("sources_dropped", dog.id), ("removed", denver.id)], key=lambda kc: kc[1]
    ) + [("restored", boston.id)]
    after = apply(more, changes)
    assert set(after) == {boston.id, dog.id}
    assert after[boston.id].current and after[boston.id].revision == 3
    assert [s.seq for s in after[dog.id].sources] == [3] and after[dog.id].valid_from == 3 * DAY
    assert after[dog.id].id == dog.id  # an id is given once


def test_a_session_delete_forgets_its_sources():
    state, _ = replay(
        [
            (cand("Caroline lives in Boston.", 1, session="s1"), Decision("add")),
            (cand("Caroline has a dog.", 2, session="s2"), Decision("add")),
        ]
    )
    keys = sources_in_sessions(state, {"s2"})
    assert keys == {("s2", "e2")}
    assert [f.statement for f in apply(state, without_sources(state, keys)).values()] == ["Caroline lives in Boston."]


def test_scrub_erases_forgotten_sources_from_every_revision():
    state, log = replay(
        [
            (cand("Caroline has a dog.", 1), Decision("add")),
            (cand("Caroline has a dog", 2), Decision("merge", fact_id("a", "u", "Caroline has a dog.", src(1)))),
            (cand("Caroline lives in Boston.", 3), Decision("add")),
        ]
    )
    clean = scrub(log, {("s1", "e1"), ("s1", "e3")})
    assert [(c.kind, [s.seq for s in c.fact.sources]) for c in clean] == [("merged", [2])]


# --- by property ----------------------------------------------------------------------

STATEMENTS = [
    "Caroline lives in Boston.",
    "caroline lives in boston",
    "Caroline moved to Denver.",
    "Melanie paints.",
    "Melanie has two kids.",
    "Jordan is from Denver.",
]
ENTITIES = ["Caroline", "Melanie", "Boston", "Denver", "Jordan"]

# A step is drawn abstractly and made concrete against the state it meets:
# (statement, entities, user, how many earlier turns it cites too, action, target pick)
STEP = st.tuples(
    st.sampled_from(STATEMENTS),
    st.lists(st.sampled_from(ENTITIES), max_size=3),
    st.sampled_from(["u", "v"]),
    st.integers(0, 2),
    st.sampled_from(["add", "merge", "invalidate", "none", "predecide"]),
    st.integers(0, 20),
)


def concrete(steps) -> list[tuple[Candidate, Decision]]:
    """Turn drawn steps into valid (candidate, decision) pairs, deterministically."""
    out: list[tuple[Candidate, Decision]] = []
    state: dict[str, Fact] = {}
    for seq, (statement, entities, user, back, action, pick) in enumerate(steps, start=1):
        seqs = sorted({seq, *(max(1, seq - k - 1) for k in range(back))})
        candidate = Candidate(
            app="a",
            user=user,
            statement=statement,
            entities=tuple(entities),
            sources=tuple(src(s, session=f"s{s % 3}") for s in seqs),
        )
        current = sorted((f for f in state.values() if f.current and f.user == user), key=lambda f: f.id)
        decision: Decision | None = None
        if action == "predecide":
            decision = predecide(state, candidate)
        elif action in ("merge", "invalidate") and current:
            target = current[pick % len(current)].id
            decision = Decision("merge", target) if action == "merge" else Decision("invalidate", invalidates=(target,))
        elif action == "none":
            decision = Decision("none")
        decision = decision or Decision("add")
        out.append((candidate, decision))
        state = apply(state, reconcile(state, candidate, decision))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=25))
def test_replaying_the_same_decisions_gives_the_same_facts_and_ids(steps):
    pairs = concrete(steps)
    first, log1 = replay(pairs)
    again, log2 = replay(pairs)
    assert first == again and log1 == log2
    # and a redelivery of every step changes nothing
    assert replay(pairs, first)[0] == first


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=25))
def test_no_change_loses_history(steps):
    state, log = replay(concrete(steps))
    revisions: dict[str, list[Fact]] = {}
    for change in log:
        before = revisions.setdefault(change.fact.id, [])
        after = change.fact
        assert after.revision == len(before) + 1
        if before:
            prev = before[-1]
            assert after.statement == prev.statement and (after.app, after.user) == (prev.app, prev.user)
            assert set(prev.sources) <= set(after.sources) and set(prev.entities) <= set(after.entities)
            if change.kind == "merged":
                assert after.invalid_from is None and prev.current
            else:
                assert change.kind == "invalidated" and prev.current and not after.current
                assert after.invalid_from is not None and after.invalid_from >= after.valid_from
                assert after.invalidated_by in state and replace(after, invalid_from=None, invalidated_by=None) == (
                    replace(prev, revision=after.revision)
                )
        else:
            assert change.kind == "added"
        before.append(after)
    assert {id: revs[-1] for id, revs in revisions.items()} == state
    assert all(history(log, id) == revs for id, revs in revisions.items())


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=25), st.data())
def test_forgetting_sources(steps, data):
    state, log = replay(concrete(steps))
    keys = sorted({s.key for f in state.values() for s in f.sources})
    # every source forgotten: no fact and no history left
    assert apply(state, without_sources(state, keys)) == {}
    assert scrub(log, keys) == []
    # some forgotten: none of them is named anywhere, and nothing dangles
    some = set(data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([])))
    after = apply(state, without_sources(state, some))
    for fact in after.values():
        assert fact.sources and not {s.key for s in fact.sources} & some
        assert fact.valid_from == fact.sources[0].at
        assert fact.invalidated_by is None or fact.invalidated_by in after
    assert all(not {s.key for s in c.fact.sources} & some for c in scrub(log, some))
    assert set(after) == {f.id for f in state.values() if {s.key for s in f.sources} - some}
