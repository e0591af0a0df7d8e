"""The query worker's held stream tail (memq.workers.query.stream_tail), fed by
hand: what it holds, what it drops, and when a read must wait."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memq.contracts.codec import encode
from memq.contracts.schemas import Event, EventAppended, Message, StateSet, TextPart
from memq.contracts.subjects import events_subject
from memq.workers.memory.tail import MustWait
from memq.workers.query.stream_tail import StreamTail

S = events_subject("a", "u", "s")
U = events_subject("a", "u")


def msg(seq: int, subject: str, data: bytes = b"{}"):
    return SimpleNamespace(subject=subject, data=data, metadata=SimpleNamespace(sequence=SimpleNamespace(stream=seq)))


def appended(text: str) -> bytes:
    event = Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))
    return encode(EventAppended(app="a", user="u", session="s", event=event))


def tail(floor: list[int], **kw) -> StreamTail:
    t = StreamTail(
        None, "MEMQ_EVENTS", lambda: floor[0], max_messages=kw.pop("max_messages", 100), max_bytes=10**6, **kw
    )
    t.held_after = t.seen = 0  # as start() leaves it on an empty stream
    return t


async def test_holds_what_is_above_the_floor_unless_a_read_pins_it():
    floor = [0]
    t = tail(floor)
    for seq in (1, 2, 3):
        await t._on_message(msg(seq, S))
    pinned = t.reader("a", "u", "s", after=1, upto=3)
    floor[0] = 3
    await t._on_message(msg(4, "other"))
    assert [seq for seq, _ in t.held(S, 0, 9)] == [2, 3]  # 1 was at the pinned floor
    pinned.close()
    await t._on_message(msg(5, "other"))
    assert t.held(S, 0, 9) == [] and t.held_after == 3


async def test_no_room_drops_the_oldest_and_reads_from_before_them_wait():
    t = tail([0], max_messages=3)
    for seq in range(1, 6):
        await t._on_message(msg(seq, S, appended(f"m{seq}")))
    assert [seq for seq, _ in t.held(S, 0, 9)] == [3, 4, 5] and t.held_after == 2
    with pytest.raises(MustWait, match="not all held"):
        await t.reader("a", "u", "s", after=1, upto=5).appended()


async def test_a_read_waits_for_what_the_consumer_has_not_delivered():
    t = tail([0], catch_up_s=0.01)
    await t._on_message(msg(1, S, appended("one")))
    with pytest.raises(MustWait, match="not delivered seq 2"):
        await t.reader("a", "u", "s", after=0, upto=2).appended()
    # SQL answered with a newer commit of the session (last_seq): it must be delivered too
    read = t.reader("a", "u", "s", after=0, upto=1)
    rows = await read.appended()
    assert [r["seq"] for r in rows] == [1]
    with pytest.raises(MustWait, match="not delivered seq 7"):
        await read.events(None, rows, 7, {})


async def test_the_users_own_messages_since_the_floor_make_a_read_wait():
    t = tail([0])
    await t._on_message(msg(1, S, appended("one")))
    state = StateSet(app="a", user="u", delta={"user:k": 1})
    await t._on_message(msg(2, U, encode(state)))  # after min_seq, and still
    with pytest.raises(MustWait, match="the user has messages"):
        read = t.reader("a", "u", "s", after=0, upto=1)
        await read.events(None, await read.appended(), 0, {})
