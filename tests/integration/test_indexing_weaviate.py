"""The indexing worker on Weaviate: the pipeline end to end, and an outage of
Weaviate in the middle of ingest (nothing acked unindexed, nothing lost)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from helpers import wait_for, wait_indexed
from services import Weaviate
from services import running as running_service
from test_indexing import APP, embedder, search_after_each_append, settings_for, stack, text  # noqa: F401 - the embedder fixture

from memq.contracts.client import MemoryClient

pytestmark = pytest.mark.timeout(300)


def weaviate_settings(nats_url, sqlite_url, tmp_path, server):
    return settings_for(
        nats_url,
        sqlite_url,
        tmp_path,
        backend="weaviate",
        weaviate={"url": server.url, "grpc_port": server.grpc_port, "collection": f"W{uuid.uuid4().hex[:10]}"},
    )


async def floor(indexing) -> int:
    info = await indexing.live.js.consumer_info(indexing.settings.streams.events, indexing.settings.indexing.durable)
    return info.ack_floor.stream_seq


async def test_search_on_weaviate(nats_url, sqlite_url, tmp_path, embedder, weaviate_server):  # noqa: F811 - the fixture imported above
    s = weaviate_settings(nats_url, sqlite_url, tmp_path, weaviate_server)
    async with stack(s, embedder):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("alice", "s1", text("user", "I adopted a golden retriever puppy named Max"))
            await client.append("bob", "s1", text("user", "bob's puppy is named Rex"))
            seq = await client.delete_session("bob", "s1", missing_ok=True)
            await wait_indexed(client, seq)
            for mode in ("keyword", "vector", "hybrid"):
                found = await client.search("alice", "puppy", mode=mode)
                assert [r.content for r in found.results] == ["I adopted a golden retriever puppy named Max"], mode
            assert (await client.search("bob", "puppy", mode="keyword")).results == []


async def test_search_right_after_an_append(nats_url, sqlite_url, tmp_path, embedder, weaviate_server):  # noqa: F811 - the fixture imported above
    s = weaviate_settings(nats_url, sqlite_url, tmp_path, weaviate_server)
    async with stack(s, embedder):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await search_after_each_append(client, "alice")


async def test_weaviate_outage_loses_nothing(nats_url, sqlite_url, tmp_path, embedder):  # noqa: F811 - the fixture imported above
    with running_service(Weaviate) as server:  # our own: this test kills it
        s = weaviate_settings(nats_url, sqlite_url, tmp_path, server)
        async with stack(s, embedder, query=False) as (indexing, _):
            async with await MemoryClient.connect(nats_url, app=APP) as client:
                seqs = await client.append_many("alice", "s", [text("user", f"fact number {i}") for i in range(20)])
                await wait_for(lambda: _at_least(indexing, seqs[-1]), timeout=60, what="first batch indexed")
                server.kill()
                seqs = await client.append_many("alice", "s", [text("user", f"later fact {i}") for i in range(30)])
                await asyncio.sleep(2.0)
                assert await floor(indexing) < seqs[-1]  # nothing acked while Weaviate is down
                server.start()
                await wait_for(lambda: _at_least(indexing, seqs[-1]), timeout=120, what="catch-up after restart")
                assert await indexing.live.backend.count() == 50


async def _at_least(indexing, seq: int) -> bool:
    return await floor(indexing) >= seq
