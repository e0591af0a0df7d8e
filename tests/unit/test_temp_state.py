"""``temp:`` state is never stored (issue 40): the docs say so, as ADK does,
yet events kept ``"temp:scratch": 1`` in their state_delta in the stream, in
SQL, in `memq history` and in exports. The contract's state delta drops them
when validated, so every door (the client's writes, the gateway's bodies, the
importer's lines, the persistence worker's decode of a raw publish, ADK's
adapter) holds none; ADK keeps them in its in-memory session."""

from __future__ import annotations

import orjson
import pytest

from memq.contracts import codec
from memq.contracts.schemas import Actions, Event, EventAppended, SessionCreated, StateSet
from memq.contracts.subjects import events_subject
from memq.workers.memory.commit_plan import event_row
from memq.workers.transfer.format import Record, parse_line, record_line

DELTA = {"turn": 1, "user:seen": 2, "app:v": 3, "temp:scratch": 4, "temperature": 5}
KEPT = {"turn": 1, "user:seen": 2, "app:v": 3, "temperature": 5}  # "temperature" is no temp: key


def test_the_rule_drops_only_the_temp_prefix():
    from memq.contracts.schemas import persisted_state

    assert persisted_state(DELTA) == KEPT
    assert persisted_state(KEPT) is KEPT  # nothing to drop: no copy


def test_every_state_carrying_message_drops_temp_keys():
    event = EventAppended(app="a", user="u", session="s", event=Event(actions=Actions(state_delta=DELTA)))
    created = SessionCreated(app="a", user="u", session="s", state=DELTA)
    state_set = StateSet(app="a", user="u", session="s", delta=DELTA, delete=["gone", "temp:old"])
    assert event.event.actions.state_delta == KEPT
    assert created.state == KEPT
    assert (state_set.delta, state_set.delete) == (KEPT, ["gone"])
    for message in (event, created, state_set):  # what the client publishes
        assert b"temp:" not in codec.encode(message)
    # only temp: keys, without a session: allowed, and nothing to store
    assert StateSet(app="a", user="u", delta={"temp:x": 1}).delta == {}


# An event as a raw publisher (no client) or an old export holds it, temp: keys and all.
RAW_EVENT = {
    "v": 1,
    "kind": "event",
    "app": "a",
    "user": "u",
    "session": "s",
    "event": {"id": "e1", "actions": {"state_delta": DELTA}},
}


def test_a_raw_publish_with_temp_state_is_stored_without_it():
    """The persistence worker decodes what a raw publisher sent (no client):
    its SQL row, which `memq history` and exports read, holds no temp: key."""
    raw = RAW_EVENT
    message = codec.decode_from_subject(events_subject("a", "u", "s"), orjson.dumps(raw))
    assert isinstance(message, EventAppended)
    row = event_row(7, "key", message)
    assert orjson.loads(row["data"])["actions"]["state_delta"] == KEPT


def test_an_imported_line_with_temp_state_is_imported_without_it():
    """An export written before the fix (its events kept temp: keys) imports clean."""
    raw = RAW_EVENT
    record = parse_line(2, record_line(7, orjson.dumps(raw)))
    assert isinstance(record, Record) and isinstance(record.message, EventAppended)
    assert record.message.event.actions.state_delta == KEPT


def test_the_gateways_bodies_drop_temp_keys():
    from memq.workers.http.models import NewEvents

    body = NewEvents.model_validate({"events": [{"actions": {"state_delta": DELTA}}]})
    assert body.events[0].actions.state_delta == KEPT


def test_adk_events_become_memq_events_without_temp_state():
    """ADK's own services trim temp: before storing (BaseSessionService.
    _trim_temp_delta_state); memq's conversion holds to it even for an
    event that was not trimmed first."""
    pytest.importorskip("google.adk")
    from google.adk.events.event import Event as AdkEvent
    from google.adk.events.event_actions import EventActions

    from memq.contracts.adapters.adk_events import to_memq

    adk = AdkEvent(author="agent", invocation_id="i", actions=EventActions(state_delta=DELTA))
    stored = to_memq(adk)
    assert stored.actions.state_delta == KEPT
    assert b"temp:" not in orjson.dumps(stored.model_dump(mode="json"))
