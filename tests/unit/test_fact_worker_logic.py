"""The fact worker's pure parts: the token budget, the generation
fingerprint, how a session's events are cut into batches, and the stored
form of a fact and the profile built from facts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.facts import extract
from memq.workers.facts.worker import PAGE, FactWorker, fingerprint, generation_name
from memq.workers.memory.facts import Fact, Source, fact_dict, fact_from_dict, profile
from memq.workers.memory.token_budget import Budget
from memq.workers.settings import Settings
from memq.workers.sql.reads import StoredEvent


def test_a_budget_waits_once_the_minute_is_spent_and_frees_as_it_slides():
    b = Budget(100)
    assert b.wait_s("a", 0.0) == 0
    b.spend("a", 60, 0.0)
    assert b.wait_s("a", 1.0) == 0  # 60 < 100
    b.spend("a", 50, 10.0)
    assert b.wait_s("a", 11.0) == pytest.approx(49.0)  # until the first call leaves the minute
    assert b.wait_s("b", 11.0) == 0  # another app's budget is its own
    assert b.wait_s("a", 60.0) == 0  # the first call left: 50 spent
    assert Budget(None).wait_s("a", 0.0) == 0


def settings(**facts) -> Settings:
    return Settings(facts={"llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, **facts})


def test_the_fingerprint_follows_the_model_the_prompt_and_the_batch(monkeypatch):
    base = fingerprint(settings().facts)
    assert fingerprint(settings().facts) == base
    assert fingerprint(settings(llm={"base_url": "http://elsewhere/v1", "model": "m"}).facts) == base  # not the URL
    assert fingerprint(settings(llm={"model": "m2"}).facts) != base
    assert fingerprint(settings(batch_turns=5).facts) != base
    monkeypatch.setattr(extract, "EXTRACT_PROMPT", extract.EXTRACT_PROMPT + " Be brief.")
    assert fingerprint(settings().facts) != base
    assert generation_name(base).startswith("facts-") and len(generation_name(base)) == 22


def event(seq: int, role: str | None, text: str) -> StoredEvent:
    said = Event(id=f"e{seq}", author=role or "", message=Message(role=role or "user", parts=[TextPart(text=text)]))
    data = said.model_dump(mode="json")
    return StoredEvent(seq, f"e{seq}", role or "", role, 1000.0 + seq, data)


def test_a_batch_takes_the_turns_with_text_and_ends_where_the_next_one_begins():
    worker = FactWorker(settings(batch_turns=2))
    events = [
        event(1, "user", "a"),
        event(2, "tool", "a tool result"),
        event(3, "assistant", " "),
        event(4, "assistant", "b"),
    ]
    events += [event(5, "user", "c"), event(6, "user", "d")]
    said, end = worker._turns("s", events, last_seq=9)
    assert [s.source.seq for s in said] == [1, 4] and end == 4  # the batch is full: seq 5 starts the next
    said, end = worker._turns("s", events[:4], last_seq=9)
    assert [s.source.seq for s in said] == [1, 4] and end == 9  # all read: up to the session's end
    said, end = worker._turns("s", [event(i, None, "x") for i in range(1, PAGE + 1)], last_seq=900)
    assert said == [] and end == PAGE  # a full page with no turn: the next page goes on from its end
    said, _ = worker._turns("other", events, last_seq=9)
    assert {s.source.session for s in said} == {"other"} and said[0].source.event_id == "e1"


def test_a_fact_round_trips_and_the_profile_groups_current_facts_by_entity():
    a = Fact("1", "app", "u", "Lives in Denver.", ("Denver",), (Source(3, "s", "e3", 30.0),), 30.0)
    b = Fact("2", "app", "u", "Works in denver as a nurse.", ("denver", "nurse"), (Source(4, "s", "e4", 40.0),), 40.0)
    old = replace(a, id="0", statement="Lives in Boston.", entities=("Boston",), invalid_from=30.0, invalidated_by="1")
    loose = Fact("3", "app", "u", "Is cheerful.", (), (Source(5, "s", "e5", 50.0),), 50.0)
    for fact in (a, b, old, loose):
        assert fact_from_dict(fact_dict(fact)) == fact
    groups = profile([b, old, loose, a])
    assert groups == {"Denver": [a, b], "nurse": [b], "": [loose]}  # the first spelling names the entity


def scoped(scope: str) -> Settings:
    s = settings()
    s.indexing = s.indexing.model_copy(update={"storage_scope": scope})
    return s


def test_the_index_storage_scope_binds_what_facts_are_mined_from():
    events = [event(1, "user", "I live in Oslo.")]
    events[0].data["message"]["parts"].append({"type": "data", "data": {"card": "4111"}})
    everything = FactWorker(settings())
    assert "4111" in everything._turns("s", events, last_seq=1)[0][0].turn.text
    talk = FactWorker(scoped("conversational"))
    assert talk._turns("s", events, last_seq=1)[0][0].turn.text == "I live in Oslo."
    none = FactWorker(scoped("summaries_only"))
    assert none._turns("s", events, last_seq=1) == ([], 1)
