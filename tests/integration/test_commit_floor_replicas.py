"""Read-your-writes with three persistence replicas committing out of order
(issue 13): the query worker's commit floor, moved by the replicas' notices,
never passes a sequence that is not in SQL yet, and a read with ``min_seq``
always sees the caller's own writes."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest
from helpers import make_settings, running, running_query

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.runtime.commit_floor import CommitFloor

APP = "floor-app"


def text(s: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=s)]))


@pytest.mark.parametrize("read_tail", [False, True], ids=["wait", "tail"])
async def test_reads_never_miss_their_writes_with_replicas_committing_out_of_order(
    nats_url, pg_url, tmp_path, read_tail
):
    """Waiting on the floor; and with the uncommitted tail read from the
    stream (memq.workers.query.stream_tail), which answers before the commit."""
    settings = make_settings(nats_url, pg_url, tmp_path, batch_size=8)
    settings.query.commit_notices = True
    settings.query.read_tail = read_tail
    committed: set[int] = set()  # sequences in SQL, recorded as each commit returns
    passed_uncommitted: list[tuple[int, list[int]]] = []
    floor_ahead_of_gaps = 0  # notices that arrived with a gap below them

    def recorded(worker: PersistenceWorker, delay_s: float):
        commit = worker.live.store.commit

        async def commit_then_record(items, *args):
            if delay_s:
                await asyncio.sleep(delay_s)  # a slow replica: later batches overtake it
            result = await commit(items, *args)
            committed.update(item.seq for item in items)
            return result

        worker.live.store.commit = commit_then_record  # type: ignore[method-assign]

    async with AsyncExitStack() as stack:
        query = await stack.enter_async_context(running_query(settings))
        floor: CommitFloor = query.live.of(APP).floor
        finished = floor.finished

        def checked_finished(ranges) -> None:
            nonlocal floor_ahead_of_gaps
            finished(ranges)
            if floor._floor.runs:
                floor_ahead_of_gaps += 1
            missing = [s for s in range(1, floor.value + 1) if s not in committed]
            if missing:
                passed_uncommitted.append((floor.value, missing[:10]))

        floor.finished = checked_finished  # type: ignore[method-assign]
        replicas = []
        for delay_s in (0.15, 0.0, 0.0):
            worker = await stack.enter_async_context(running(PersistenceWorker(settings)))
            recorded(worker, delay_s)
            replicas.append(worker)

        async with await MemoryClient.connect(nats_url, app=APP) as client:

            async def agent(a: int) -> None:
                session, ids = f"agent-{a}", []
                for turn in range(12):
                    event = text(f"agent {a} turn {turn}")
                    seq = await client.append("u", session, event)
                    ids.append(event.id)
                    view = await client.history("u", session, min_seq=seq)
                    got = [e.event["id"] for e in view.events]
                    assert got == ids, f"{session} turn {turn}: read {len(got)} of {len(ids)} own events"
                    if not read_tail:
                        assert seq in committed, f"seq {seq} answered before it was committed"

            async def burst(b: int) -> None:  # keeps every replica busy with batches
                for _ in range(6):
                    await client.append_many("u", f"burst-{b}", [text("noise")] * 20)

            await asyncio.gather(*(agent(a) for a in range(8)), *(burst(b) for b in range(3)))

        assert passed_uncommitted == [], f"the floor passed uncommitted sequences: {passed_uncommitted[:3]}"
        assert sum(w.committed > 0 for w in replicas) >= 2, [w.committed for w in replicas]
        assert floor_ahead_of_gaps > 0, "no notice arrived out of order: the test did not reorder anything"
