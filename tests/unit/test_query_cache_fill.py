"""A cache miss is answered before its answer is stored (no servers needed):
the requester does not wait on the shared tier's round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fakes import query_live

from memq.contracts import queries as q
from memq.workers.query.cache import MemoryBackend, QueryCache
from memq.workers.query.worker import QueryLive, QueryWorker
from memq.workers.settings import Settings


class SlowStoreBackend(MemoryBackend):
    """The in-process backend whose stores wait until released, as a slow Redis would."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.storing = asyncio.Event()

    async def store(self, key: str, value: bytes, ttl_s: float) -> None:
        self.storing.set()
        await self.release.wait()
        await super().store(key, value, ttl_s)

    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        return self.lookup_now(gen_keys, entry_prefix)


class Floor:
    value = 7

    async def current(self) -> int:
        return self.value

    async def wait_for(self, seq: int, timeout_s: float) -> int:
        self.value = max(self.value, seq)  # as if the commit landed
        return self.value


class CountingBackend(MemoryBackend):
    """The in-process backend standing in for Redis, counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        self.calls.append("lookup")
        return await super().lookup(gen_keys, entry_prefix)

    async def store(self, key: str, value: bytes, ttl_s: float) -> None:
        self.calls.append("store")
        await super().store(key, value, ttl_s)


class Request:
    subject = "_INBOX.test"

    def __init__(self) -> None:
        self.replies: list[bytes] = []

    async def respond(self, body: bytes) -> None:
        self.replies.append(body)


async def reply(worker: QueryWorker, req: q.Request, key: str) -> bytes:
    """The request answered as a replica answers it (cache fill included)."""
    request = Request()
    await worker._respond("state.get", req, key, request, 0.0, worker.slots.admit(req.app, "state.get"))
    return request.replies[0]


def live(cache: QueryCache) -> QueryLive:
    """Running parts with no connection: the requests here need none."""
    return query_live(Floor(), cache=cache)


def worker_with(shared: MemoryBackend, tmp_path) -> QueryWorker:
    worker = QueryWorker(Settings(data_dir=tmp_path, database={"url": "inmemory"}))
    worker._live = live(QueryCache(local=None, shared=shared, ttl_s=60))

    async def run(op: str, req: q.Request, **extra) -> q.StateView:
        return q.StateView(state={"k": 1})

    worker._run = run  # type: ignore[method-assign]
    return worker


async def test_a_miss_is_answered_before_the_slow_store_and_stored_after(tmp_path):
    shared = SlowStoreBackend()
    worker = worker_with(shared, tmp_path)
    req = q.StateGet(app="a", user="u", session="s")
    request = Request()
    slot = worker.slots.admit(req.app, "state.get")
    responding = asyncio.create_task(worker._respond("state.get", req, "key", request, 0.0, slot))
    await asyncio.wait_for(shared.storing.wait(), 5)
    assert request.replies == [b'{"ok":true,"result":{"state":{"k":1}}}']  # while the store still waits
    assert not responding.done()
    shared.release.set()
    await asyncio.wait_for(responding, 5)
    _, entry = await worker.live.cache.get("a", "u", "s", "key")
    assert entry is not None and entry.as_of == 7 and entry.body == request.replies[0]


async def test_a_read_that_waits_for_a_commit_uses_this_replicas_tier_alone(tmp_path):
    shared = CountingBackend()
    worker = worker_with(shared, tmp_path)
    worker._live = live(QueryCache(local=MemoryBackend(), shared=shared, ttl_s=60))
    # min_seq 9 is above the floor (7): the read waits, then neither looks
    # the shared tier up nor stores its answer there; the local tier has it.
    waited = await reply(worker, q.StateGet(app="a", user="u", session="s", min_seq=9), "k1")
    assert shared.calls == []
    assert worker.live.cache.get_local("a", "u", "s", "k1").body == waited
    # At or below the floor: both tiers, as any read.
    await reply(worker, q.StateGet(app="a", user="u", session="s", min_seq=9), "k2")
    await reply(worker, q.StateGet(app="a", user="u", session="s"), "k3")
    assert shared.calls == ["lookup", "store", "lookup", "store"]
