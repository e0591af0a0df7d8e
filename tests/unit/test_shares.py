"""The fair shares of the query worker's request slots (workers/memory/shares.py)
and their asyncio side (workers/query/slots.py): no app holds every slot, a
full pool is served in turn, and a waiting read holds none."""

from __future__ import annotations

import asyncio

import pytest

from memq.contracts.errors import Busy
from memq.workers.memory.shares import Caps, FairShares, share_of
from memq.workers.query.slots import RequestSlots


def test_an_app_past_its_share_is_over_and_takes_nothing():
    pool: FairShares[int] = FairShares(total=4, share=2)
    assert [pool.ask("a", i) for i in range(3)] == ["now", "now", "over"]
    assert pool.used == 2 and pool.held("a") == 2
    assert pool.ask("b", 10) == "now" and pool.ask("b", 11) == "now"  # b has its own share
    assert pool.used == 4


def test_a_full_pool_queues_and_serves_the_apps_in_turn():
    pool: FairShares[str] = FairShares(total=3, share=2)
    assert pool.ask("a", "a1") == "now" and pool.ask("a", "a2") == "now" and pool.ask("b", "b1") == "now"
    # The pool is full: each within its share, they queue.
    assert pool.ask("b", "b2") == "queued"
    assert pool.ask("c", "c1") == "queued"
    assert pool.ask("c", "c2") == "queued"
    assert pool.ask("c", "c3") == "over"  # c holds its share in its queue
    # a's slot goes to b (first in turn), then c, then c again; each app's own in order.
    assert pool.release("a") == ["b2"]
    assert pool.release("a") == ["c1"]
    assert pool.release("b") == ["c2"]
    assert pool.release("b") == []
    assert pool.used == 2 and pool.in_use("c") == 2


def test_an_app_at_its_share_does_not_hold_up_the_next():
    pool: FairShares[str] = FairShares(total=4, share=2)
    pool.ask("a", "a1"), pool.ask("a", "a2"), pool.ask("b", "b1"), pool.ask("c", "c1")
    assert pool.ask("a", "a3", within_share=False) == "queued"  # a read back from its wait
    assert pool.ask("d", "d1") == "queued"
    # A slot of c's: a is at its share, so d has it though a queued first.
    assert pool.release("c") == ["d1"]
    assert pool.release("a") == ["a3"]  # a's own slot: a's queue


def test_a_withdrawn_ticket_is_never_granted():
    pool: FairShares[str] = FairShares(total=1, share=1)
    assert pool.ask("a", "a1") == "now"
    assert pool.ask("b", "b1") == "queued"
    assert pool.withdraw("b", "b1") and not pool.withdraw("b", "b1")
    assert pool.release("a") == [] and pool.used == 0
    assert pool.ask("b", "b2") == "now"


def test_shares_are_a_fraction_of_the_pool_and_never_none():
    assert share_of(256, 0.5) == 128
    assert share_of(3, 0.1) == 1
    assert share_of(10, 1.0) == 10
    with pytest.raises(ValueError):
        FairShares(total=0, share=1)
    with pytest.raises(ValueError, match="holds no slot"):
        FairShares(total=1, share=1).release("a")


def test_caps_refuse_past_the_cap():
    caps = Caps(2)
    assert caps.take("a") and caps.take("a") and not caps.take("a")
    assert caps.take("b")
    caps.give("a")
    assert caps.count("a") == 1 and caps.take("a")


async def test_a_busy_app_is_refused_with_its_share_named():
    slots = RequestSlots(total=4, share=0.5, waiting=8)
    held = [slots.admit("a", "history") for _ in range(2)]
    with pytest.raises(
        Busy, match=r"history: app 'a' has 2 requests in flight .* \(query\.app_share 0\.5 of query\.max_inflight 4\)"
    ):
        slots.admit("a", "history")
    other = slots.admit("b", "history")
    await other.ready()
    held[0].close()
    again = slots.admit("a", "history")
    assert again.held


async def test_a_waiting_read_holds_no_slot_and_gets_one_back():
    slots = RequestSlots(total=2, share=0.5, waiting=1)
    waiter = slots.admit("a", "history")
    committed = asyncio.Event()

    async def wait() -> None:
        async with slots.waiting(waiter, "history"):
            await committed.wait()

    waiting = asyncio.create_task(wait())
    await asyncio.sleep(0)
    assert not waiter.held and slots.shares.used == 0
    second = slots.admit("a", "history")  # a's one slot is free again while it waits
    assert second.held
    with pytest.raises(Busy, match=r"1 reads waiting .*query\.app_waiting"):
        async with slots.waiting(second, "history"):
            pass
    committed.set()
    await asyncio.sleep(0)
    assert not waiting.done() and not waiter.held  # back from its wait, queued behind a's own slot
    second.close()
    await asyncio.wait_for(waiting, 5)
    assert waiter.held
    waiter.close()
    assert slots.shares.used == 0


async def test_a_wait_that_fails_leaves_no_slot_held():
    slots = RequestSlots(total=2, share=1.0, waiting=4)
    slot = slots.admit("a", "history")
    with pytest.raises(TimeoutError):
        async with slots.waiting(slot, "history"):
            raise TimeoutError
    slot.close()
    assert slots.shares.used == 0 and slots.waits.count("a") == 0


async def test_a_queued_request_that_is_cancelled_gives_its_place_up():
    slots = RequestSlots(total=1, share=1.0, waiting=4)
    first = slots.admit("a", "history")
    queued = slots.admit("b", "history")
    task = asyncio.create_task(queued.ready())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    queued.close()
    first.close()
    assert slots.shares.used == 0
