"""The Weaviate backend heals its own connection (issue 11: after a Weaviate
restart, search stayed unavailable for good, "current version is 0.0.0").

A connect cut short (a recall's timeout cancels it while the server is slow
or restarting) must leave no half-open client behind, and a backend whose
calls fail must reconnect by itself once the server is back: no caller has
to reopen it."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pytest
from services import HOST, Weaviate, free_port, running

from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.index.backends.weaviate import WeaviateIndex
from memq.workers.memory.recall import Doc, SearchQuery
from memq.workers.settings import WeaviateSettings

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]

DIM = 4


def settings(port: int, grpc_port: int) -> WeaviateSettings:
    return WeaviateSettings(
        url=f"http://{HOST}:{port}", grpc_port=grpc_port, collection=f"R{uuid.uuid4().hex[:10]}", timeout_s=5
    )


def doc(i: int) -> Doc:
    return Doc(
        id=f"d{i}",
        app="a",
        user="u",
        session="s",
        seq=i,
        author="user",
        role="user",
        timestamp=1.0 + i,
        text=f"remember fact {i}",
        search_text=f"remember fact {i}",
        vector=[1.0, 0.0, 0.0, 0.0],
    )


async def until_ok(call, timeout: float):
    """``call()`` again until it stops raising IndexUnavailable; (result, seconds)."""
    t0 = time.monotonic()
    while True:
        try:
            return await call(), time.monotonic() - t0
        except IndexUnavailable as exc:
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"still unavailable after {timeout:.0f}s: {exc}") from None
            await asyncio.sleep(0.1)


async def test_a_connect_cut_short_leaves_no_broken_client():
    port, grpc_port = free_port(), free_port()
    # A server that accepts and never answers, as one that is starting up on a busy machine.
    stall = socket.create_server((HOST, port))
    index = WeaviateIndex(settings(port, grpc_port))
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(index.open(), 0.5)  # a recall's timeout
    finally:
        stall.close()
    with running(lambda: Weaviate(port=port, grpc_port=grpc_port)):
        try:
            # The same object works once the server is up: before the fix,
            # every call failed for good ("... The current version is 0.0.0").
            live, took = await until_ok(index.live, timeout=10)
            assert live is None
            gen = await index.create_generation("test", DIM)
            await index.promote(gen.generation)
            await index.upsert([doc(1)])
            hits = await index.search(SearchQuery(app="a", user="u", text="remember", mode="keyword"))
            assert [h.doc.id for h in hits] == ["d1"]
        finally:
            await index.close()


async def test_searches_work_again_soon_after_weaviate_restarts(own_weaviate):
    index = WeaviateIndex(settings(own_weaviate.port, own_weaviate.grpc_port))
    query = SearchQuery(app="a", user="u", text="remember", mode="keyword")
    await index.open()
    try:
        await index.promote((await index.create_generation("test", DIM)).generation)
        await index.upsert([doc(i) for i in range(3)])
        assert len(await index.search(query)) == 3
        own_weaviate.kill()
        # Calls fail while it is down, typed; after REOPEN_AFTER_S of that the
        # client is replaced. (live() is REST and fails at once; a search
        # would sit out the client's own gRPC retries first.)
        for _ in range(4):
            with pytest.raises(IndexUnavailable):
                await index.live()
            await asyncio.sleep(1.0)
        await asyncio.to_thread(own_weaviate.start)
        hits, took = await until_ok(lambda: index.search(query), timeout=30)
        print(f"searches answered again {took:.1f}s after Weaviate was back")
        assert len(hits) == 3
        assert took < 5.0, f"searches failed for {took:.1f}s after Weaviate was back\n{own_weaviate.log_tail(40)}"
    finally:
        await index.close()
