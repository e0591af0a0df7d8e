"""Tokens counted ahead of a commit (``commit_plan.event_tokens``, which the
persistence worker runs in a thread for a batch of large events) are the
ones the commit stores, and the plan takes them instead of counting again."""

from __future__ import annotations

from memq.contracts.schemas import Event, EventAppended, Message, StateSet, TextPart
from memq.workers.memory import commit_plan
from memq.workers.memory.commit_plan import Incoming, Tombstones, event_tokens, plan_commit


def said(text: str) -> EventAppended:
    return EventAppended(
        app="a", user="u", session="s", event=Event(message=Message(role="user", parts=[TextPart(text=text)]))
    )


ITEMS = [
    Incoming(3, said("hello there, how are you")),
    Incoming(4, StateSet(app="a", user="u", session="s", delta={"k": 1})),
    Incoming(5, said("  " * 500)),
]


def test_counted_ahead_is_what_the_commit_counts():
    counted = event_tokens(ITEMS)
    assert sorted(counted) == [3, 5]  # events only
    inline = {e["seq"]: e["tokens"] for e in plan_commit(ITEMS, Tombstones()).events}
    assert counted == inline


def test_the_plan_takes_the_counts_it_is_given(monkeypatch):
    counted = event_tokens(ITEMS)

    def no_counting(*args, **kwargs):
        raise AssertionError("counted again")

    monkeypatch.setattr(commit_plan, "count_event", no_counting)
    plan = plan_commit(ITEMS, Tombstones(), counted)
    assert {e["seq"]: e["tokens"] for e in plan.events} == counted
