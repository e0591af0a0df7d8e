"""reused_event_ids: the events the persistence worker dead-letters because
their session already holds their id with other content (issue 27)."""

from __future__ import annotations

from memq.contracts.ids import scope_key
from memq.contracts.schemas import Event, EventAppended, Message, StateSet, TextPart
from memq.workers.memory.commit_plan import Incoming, event_row, reused_event_ids

KEY = scope_key("a", "u", "s")


def appended(text: str, id: str = "e1", session: str = "s", timestamp: float = 1.0) -> EventAppended:
    event = Event(id=id, timestamp=timestamp, message=Message(role="user", parts=[TextPart(text=text)]))
    return EventAppended(app="a", user="u", session=session, event=event)


def stored(seq: int, m: EventAppended) -> dict:
    return {(KEY, m.event.id): (seq, event_row(seq, KEY, m)["data"])}


def test_other_content_under_a_stored_id_is_reused():
    first = appended("one")
    reused = reused_event_ids([Incoming(9, appended("two"))], stored(3, first))
    assert list(reused) == [9] and "at seq 3" in reused[9]


def test_the_same_content_again_and_redeliveries_are_not():
    first = appended("one")
    assert reused_event_ids([Incoming(9, appended("one"))], stored(3, first)) == {}  # a retry past the window
    assert reused_event_ids([Incoming(3, appended("two"))], stored(3, first)) == {}  # its own row (a redelivery)


def test_within_a_batch_the_first_in_stream_order_stays():
    items = [Incoming(7, appended("two")), Incoming(5, appended("one")), Incoming(8, appended("one"))]
    assert list(reused_event_ids(items, {})) == [7]


def test_other_sessions_and_other_kinds_are_left_alone():
    items = [
        Incoming(5, appended("one")),
        Incoming(6, appended("two", session="t")),
        Incoming(7, StateSet(app="a", user="u", id="e1", delta={"user:k": 1})),
    ]
    assert reused_event_ids(items, {}) == {}
