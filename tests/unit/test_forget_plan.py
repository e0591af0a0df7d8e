"""What a forget does to a commit plan and to a cached window, without I/O
(workers/memory/commit_plan.py, workers/sql/window.py)."""

from __future__ import annotations

from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, EventAppended, EventForgotten, Message, SessionDeleted, TextPart
from memq.workers.memory.commit_plan import Incoming, Tombstones, plan_commit
from memq.workers.sql import reads
from memq.workers.sql.window import SessionWindow, Window, _same_history

IDS = dict(app="a", user="u", session="s")
KEY = scope_key("a", "u", "s")


def said(text: str) -> EventAppended:
    return EventAppended(**IDS, event=Event(message=Message(role="user", parts=[TextPart(text=text)])))


def test_an_event_forgotten_in_its_own_batch_is_never_written_and_the_forget_is_the_last_message():
    plan = plan_commit(
        [Incoming(1, said("a")), Incoming(2, said("secret")), Incoming(3, EventForgotten(**IDS, seq=2))],
        Tombstones(),
    )
    assert [e["seq"] for e in plan.events] == [1]
    assert plan.forgets == {KEY: {2: 3}}
    assert plan.touched[KEY].last_seq == 3


def test_a_forget_alone_touches_no_session():
    plan = plan_commit([Incoming(5, EventForgotten(**IDS, seq=2))], Tombstones())
    assert plan.forgets == {KEY: {2: 5}} and plan.touched == {}


def test_a_forget_names_only_an_earlier_message_of_a_live_session():
    assert plan_commit([Incoming(5, EventForgotten(**IDS, seq=5))], Tombstones()).forgets == {}
    assert plan_commit([Incoming(5, EventForgotten(**IDS, seq=9))], Tombstones()).forgets == {}
    deleted_after = [Incoming(5, EventForgotten(**IDS, seq=2)), Incoming(6, SessionDeleted(**IDS))]
    assert plan_commit(deleted_after, Tombstones()).forgets == {}
    assert plan_commit([Incoming(5, EventForgotten(**IDS, seq=2))], Tombstones(sessions={KEY: 6})).forgets == {}


def test_a_forget_is_keyed_by_its_own_session():
    other = dict(IDS, session="t")
    plan = plan_commit(
        [Incoming(1, EventAppended(**other, event=said("x").event)), Incoming(2, EventForgotten(**IDS, seq=1))],
        Tombstones(),
    )
    assert [e["seq"] for e in plan.events] == [1]  # the other session's event is written
    assert plan.forgets == {KEY: {1: 2}}


def _row(forgot_seq: int, deleted_seq: int = 0) -> reads.SessionRow:
    return reads.SessionRow("a", "u", "s", 0.0, 0.0, 9, deleted_seq, forgot_seq)


def test_a_window_cached_before_a_forget_is_not_extended():
    cached = SessionWindow(_row(0), Window(items=[], events={}, stored={}, checkpoint=None), through=9)
    assert _same_history(cached, _row(0), None)
    assert not _same_history(cached, _row(12), None)
    assert not _same_history(cached, _row(0, deleted_seq=12), None)
