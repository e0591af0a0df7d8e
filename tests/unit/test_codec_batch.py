"""Encoding a session's events in bulk (``event_encoder``, ``append_many``)
gives the bytes, subjects, dedupe ids and errors of encoding them one by one."""

from __future__ import annotations

import pytest
from fakes import FakeNats

from memq.contracts.client import MemoryClient
from memq.contracts.codec import encode, event_encoder
from memq.contracts.errors import InvalidId, Oversize
from memq.contracts.schemas import DataPart, Event, EventAppended, Message, TextPart, ToolCallPart

# Ids that need escaping in subjects, and text that would trip a format string.
APP, USER, SESSION = "app~1", "us.er %b", "sess ion\t%s"


def events() -> list[Event]:
    return [
        Event(message=Message(role="user", parts=[TextPart(text="héllo %s %% {} \u2028")])),
        Event(
            id="a.b c",
            message=Message(role="assistant", parts=[ToolCallPart(id="c1", name="f", args={"x": [1, None, 2.5]})]),
            metadata={"k": None},
        ),
        Event(author="x", message=Message(role="tool", parts=[DataPart(data={"n": 2**63})])),
        Event(),
    ]


def one_by_one(event: Event) -> EventAppended:
    return EventAppended(app=APP, user=USER, session=SESSION, event=event)


def test_event_encoder_gives_the_bytes_of_encode():
    evs = events()
    encode_event = event_encoder(one_by_one(evs[0]))
    assert [encode_event(e) for e in evs] == [encode(one_by_one(e)) for e in evs]


def test_append_many_prepares_what_single_appends_prepare():
    client = MemoryClient(FakeNats(), APP)  # type: ignore[arg-type]
    evs = events()
    as_dict = evs[1].model_dump()  # not an Event: validated in full, same result
    bulk = client._prepare_events(USER, SESSION, [*evs, as_dict])
    single = [client._prepare(one_by_one(e)) for e in [*evs, evs[1]]]
    assert bulk == single


def test_append_many_refuses_before_any_publish():
    client = MemoryClient(FakeNats(), APP, max_message_bytes=2000)  # type: ignore[arg-type]
    big = Event(message=Message(role="user", parts=[TextPart(text="x" * 3000)]))
    with pytest.raises(Oversize, match="event message is .* bytes; the limit is 2000"):
        client._prepare_events(USER, SESSION, [*events(), big])
    with pytest.raises(InvalidId):
        client._prepare_events("", SESSION, events())
    assert client._prepare_events(USER, SESSION, []) == []
