"""The uncommitted tail's pure rules (memq.workers.memory.tail) and how a
window takes it (memq.workers.sql.window.with_tail)."""

from __future__ import annotations

import pytest

from memq.contracts.schemas import (
    ArtifactSaved,
    CheckpointSaved,
    Event,
    EventAppended,
    Message,
    SessionCreated,
    SessionDeleted,
    StateSet,
    TextPart,
    UserDeleted,
)
from memq.workers.memory.commit_plan import Incoming, Tombstones, plan_commit
from memq.workers.memory.context import item_from_event
from memq.workers.memory.strategies import Strategy
from memq.workers.memory.tail import MustWait, tail_events
from memq.workers.sql.reads import CheckpointRow, StoredEvent
from memq.workers.sql.window import Window, with_tail

SCOPE = dict(app="a", user="u", session="s")


def appended(body: str, **event) -> EventAppended:
    return EventAppended(
        **SCOPE, event=Event(author="user", message=Message(role="user", parts=[TextPart(text=body)]), **event)
    )


def test_rows_are_what_the_commit_writes_first_id_wins_and_the_rest_is_skipped():
    first = appended("one")
    items = [
        Incoming(10, first),
        Incoming(11, StateSet(**SCOPE, delta={"k": 1})),
        Incoming(12, ArtifactSaved(**SCOPE, filename="f", inline=b"x")),
        Incoming(13, first.model_copy(update={"event": first.event.model_copy(update={"timestamp": 1.0})})),
        Incoming(14, appended("two")),
    ]
    rows = tail_events(items, "key")
    assert [r["seq"] for r in rows] == [10, 14]
    planned = plan_commit([items[0], items[4]], Tombstones()).events
    for row, written in zip(rows, planned, strict=True):
        assert {**written, "data": row["data"], "session_key": "key"} == row
        assert row["data"]["id"] == written["event_id"]


@pytest.mark.parametrize(
    "message",
    [
        SessionCreated(**SCOPE),
        SessionDeleted(**SCOPE),
        UserDeleted(app="a", user="u"),
        CheckpointSaved(**SCOPE, summary="s", up_to_seq=3),
    ],
)
def test_anything_but_appends_must_wait(message):
    with pytest.raises(MustWait, match=message.kind):
        tail_events([Incoming(5, appended("x")), Incoming(6, message)], "key")


def stored(seq: int) -> StoredEvent:
    data = appended(f"event {seq}").event.model_dump(mode="json", exclude_none=True)
    return StoredEvent(seq, data["id"], "user", "user", 0.0, data, tokens=item_from_event(seq, data).tokens)


def window_of(events: list[StoredEvent], checkpoint: CheckpointRow | None = None) -> Window:
    return Window(
        items=[item_from_event(e.seq, e.data, tokens=e.tokens) for e in events],
        events={e.seq: e.data for e in events},
        stored={e.seq: e for e in events},
        checkpoint=checkpoint,
    )


ALL = Strategy(kind="all")


def test_tail_events_go_in_seq_order_once_each():
    window = window_of([stored(1), stored(2), stored(5)])  # 5: committed out of order by another replica
    merged = with_tail(window, [stored(3), stored(4), stored(5)], ALL, None, tombstone=0)
    assert [it.seq for it in merged.items] == [1, 2, 3, 4, 5] == list(merged.stored) == list(merged.events)
    assert merged.stored[5] is window.stored[5]


def test_tail_events_below_the_tombstone_or_in_the_summary_are_dropped():
    window = window_of([stored(8)], CheckpointRow(seq=7, up_to_seq=6, summary="s", tokens=3))
    merged = with_tail(window, [stored(6), stored(9), stored(10)], ALL, None, tombstone=10)
    assert [it.seq for it in merged.items] == [8, 10]
    assert with_tail(window, [stored(6)], ALL, None, tombstone=0) is window


def test_the_strategy_cut_is_the_walks():
    events = [stored(i) for i in range(1, 400)]
    window = Strategy(kind="buffer_window", window=5)
    merged = with_tail(window_of(events[:390]), events[390:], window, None, tombstone=0)
    assert [it.seq for it in merged.items][-1] == 399
    assert len(merged.items) == window.window + 128 + 1  # as _enough_from keeps for a walk
