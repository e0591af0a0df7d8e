"""The client's record of its own recent writes (memq.contracts.carry) and
what the query service makes of them (memq.workers.memory.tail.carried_events):
the promise "every write to the session after ``after`` is carried" holds
however the caps push writes out, sessions are forgotten or the byte budget
cuts; writes are kept until a reply says they are committed."""

from __future__ import annotations

import time

import pytest

from memq.contracts.carry import RecentWrites
from memq.contracts.queries import MAX_CARRIED, Carried
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.memory.tail import MustWait, carried_events


def event(body: str = "hi") -> Event:
    return Event(message=Message(role="user", parts=[TextPart(text=body)]))


def seqs(carried: dict) -> list[int]:
    return [w["seq"] for w in carried["writes"]]


def test_a_new_session_carries_nothing_after_zero():
    assert RecentWrites().carried("u", "s", 10) == {"after": 0, "writes": [], "user_seq": 0}


def test_writes_up_to_the_read_are_carried_in_order():
    log = RecentWrites()
    for seq in (3, 5, 9):
        log.wrote("u", "s", seq, "event", event(), 10)
    log.wrote("u", "other", 7, "event", event(), 10)
    assert seqs(log.carried("u", "s", 9)) == [3, 5, 9]
    assert seqs(log.carried("u", "s", 6)) == [3, 5]  # what the read need not hold stays out


def test_writes_over_the_count_cap_move_after_past_them():
    log = RecentWrites()
    for seq in range(1, MAX_CARRIED + 6):
        log.wrote("u", "s", seq, "event", event(), 1)
    carried = log.carried("u", "s", 10_000)
    assert carried["after"] == 5 and seqs(carried) == list(range(6, MAX_CARRIED + 6))


def test_the_byte_budget_cuts_the_oldest():
    log = RecentWrites(max_bytes=100)
    for seq, size in ((1, 30), (2, 80), (3, 40), (4, 50)):
        log.wrote("u", "s", seq, "event", event(), size)
    carried = log.carried("u", "s", 10)
    assert carried["after"] == 2 and seqs(carried) == [3, 4]


def test_a_forgotten_session_and_user_leave_after_at_their_newest_write():
    log = RecentWrites(max_keys=2)
    log.wrote("u", "a", 4, "event", event(), 1)
    log.wrote("u", None, 6, "state.set")
    log.wrote("u", "b", 5, "event", event(), 1)
    log.wrote("u", "c", 8, "event", event(), 1)  # forgets "a"
    assert log.carried("u", "a", 100)["after"] == 4
    assert log.carried("u", "c", 100)["after"] == 0  # written since: its own record
    for user in ("v", "w"):
        log.wrote(user, None, 9, "state.set")  # forgets u's user record
    assert log.carried("u", "c", 100)["user_seq"] >= 6


def carried(**fields) -> Carried:
    return Carried.model_validate(fields)


def rows(c: Carried, floor: int, upto: int = 100) -> list[int]:
    return [r["seq"] for r in carried_events(c, floor, upto, "app", "u", "s", "key")]


def test_carried_events_above_the_floor_become_rows():
    c = carried(after=2, writes=[{"seq": 3, "event": event("a")}, {"seq": 5, "event": event("b")}])
    assert rows(c, floor=2) == [3, 5]
    assert rows(c, floor=3) == [5]  # committed ones come from SQL
    assert rows(c, floor=2, upto=4) == [3]


def test_state_and_artifacts_leave_the_events_alone():
    c = carried(
        writes=[{"seq": 3, "kind": "state.set"}, {"seq": 4, "event": event()}, {"seq": 5, "kind": "artifact.save"}]
    )
    assert rows(c, floor=0) == [4]


@pytest.mark.parametrize(
    ("fields", "floor"),
    [
        ({"after": 5}, 4),  # writes up to 5 are not carried and may not be committed
        ({"user_seq": 5}, 4),  # a user-level write above the floor
        ({"writes": [{"seq": 5, "kind": "session.create"}]}, 4),
        ({"writes": [{"seq": 5, "kind": "session.delete"}]}, 4),
        ({"writes": [{"seq": 5, "kind": "event"}]}, 4),  # an event the client did not keep
    ],
)
def test_what_cannot_be_told_without_the_commit_must_wait(fields, floor):
    with pytest.raises(MustWait):
        rows(carried(**fields), floor)


def test_below_the_floor_nothing_must_wait():
    c = carried(after=3, user_seq=4, writes=[{"seq": 4, "kind": "session.create"}])
    assert rows(c, floor=4) == []


def test_writes_are_carried_until_a_reply_says_they_are_committed():
    """Not for a fixed time: behind another app's backlog a commit takes
    seconds (issue 38), and a write dropped early makes the read wait for it."""
    log = RecentWrites()
    log.wrote("u", "s", 3, "event", event(), 10)
    log.committed("u", "s", 2)  # a reply whose floor is still below the write
    log.wrote("u", "s", 4, "event", event(), 10)
    time.sleep(1.2)  # longer than writes were once kept (1 s), with no reply saying more
    for _ in range(3):  # reads while the floor stays put keep both
        carried = log.carried("u", "s", 10)
        assert carried["after"] == 2 and seqs(carried) == [3, 4]
    log.committed("u", "s", 3)
    carried = log.carried("u", "s", 10)
    assert carried["after"] == 3 and seqs(carried) == [4]


def test_what_is_kept_stays_within_the_byte_cap():
    log = RecentWrites(max_bytes=100)
    for seq in range(1, 41):
        log.wrote("u", "s", seq, "event", event(), 30)
    record = log._sessions[("u", "s")]
    assert record.size <= 100 and [w[0] for w in record.writes] == [38, 39, 40]
    assert log.carried("u", "s", 100)["after"] == 37


def test_a_write_over_the_byte_cap_is_not_kept_and_after_passes_it():
    log = RecentWrites(max_bytes=100)
    log.wrote("u", "s", 1, "event", event(), 10)
    log.wrote("u", "s", 2, "event", event(), 101)  # could never be carried: its read waits
    assert log._sessions[("u", "s")].size == 0
    assert log.carried("u", "s", 10) == {"after": 2, "writes": [], "user_seq": 0}
    log.wrote("u", "s", 3, "event", event(), 10)  # a small one after it is carried again
    carried = log.carried("u", "s", 10)
    assert carried["after"] == 2 and seqs(carried) == [3]


def test_a_reply_that_says_what_is_committed_forgets_it():
    log = RecentWrites()
    for seq in (3, 5, 9):
        log.wrote("u", "s", seq, "event", event(), 10)
    log.committed("u", "s", 5)
    carried = log.carried("u", "s", 10)
    assert carried["after"] == 5 and seqs(carried) == [9]
