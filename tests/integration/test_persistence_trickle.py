"""Two persistence replicas sharing a trickle of appends commit each one at
once (issue 13): a lone append must not wait in a replica's fetch for a
batch to fill or for the fetch's idle timeout."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import nats
import orjson
from contention import CpuContention
from helpers import make_settings, running

from memq.contracts.client import MemoryClient
from memq.contracts.subjects import committed_subject
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.runtime import bus

APP = "trickle-app"


async def test_two_replicas_commit_a_trickle_without_holding_appends(nats_url, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path)
    finished_at: dict[int, float] = {}
    listener = await nats.connect(nats_url)

    async def heard(msg) -> None:
        at = time.monotonic()
        for first, last in orjson.loads(msg.data)["ranges"]:
            for seq in range(first, last + 1):
                finished_at.setdefault(seq, at)

    await listener.subscribe(committed_subject(settings.persistence.durable), cb=heard)
    await bus.settle(listener)  # the workers publish on connections of their own
    sent_at: dict[int, float] = {}
    async with AsyncExitStack() as stack:
        for _ in range(2):
            await stack.enter_async_context(running(PersistenceWorker(settings)))
        client = await stack.enter_async_context(await MemoryClient.connect(nats_url, app=APP))
        for s in range(10):  # the sessions exist: the trickle is the agent's usual append
            await client.append_text("u", f"s{s}", "user", "hello")

        async def append(i: int) -> None:
            at = time.monotonic()
            sent_at[await client.append_text("u", f"s{i % 10}", "user", f"message {i}")] = at

        started, pending = time.monotonic(), []
        with CpuContention() as cpu:
            for i in range(1500):  # ~1,000 appends/s for 1.5 s
                pending.append(asyncio.create_task(append(i)))
                await asyncio.sleep(max(0.0, started + (i + 1) * 0.001 - time.monotonic()))
            await asyncio.gather(*pending)
        deadline = time.monotonic() + 10
        while not set(sent_at) <= set(finished_at) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    await listener.close()
    waited = sorted(finished_at[seq] - at for seq, at in sent_at.items())
    assert len(waited) == len(sent_at)
    # 200 ms on an idle machine; when other work takes the CPU, this process
    # (client and both replicas on one loop) falls behind the 1,000/s it
    # offers and every append waits longer (a loaded CI run: 812 of 1,500
    # over 200 ms), so the bound scales with the contention seen meanwhile.
    bound = 0.2 * cpu.factor
    slow = sum(w > bound for w in waited)
    # The old fetch held ~27 % of them (403 of 1,500) for 0.4-1 s. A stall of
    # the machine (a clean-clone CI run once saw 8 over 200 ms, the slowest
    # 0.32 s) holds a few of any loop's: allow 2 %, far below the fault.
    assert slow <= len(waited) // 50, (
        f"{slow} of {len(waited)} appends waited over {bound * 1000:.0f} ms for their commit "
        f"(CPU contention {cpu.factor:.1f}; slowest {waited[-1]:.3f}s)"
    )
