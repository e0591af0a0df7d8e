"""A keyword-only index (``indexing.embedder = "none"``) end to end on the
embedded backend and on Weaviate: real NATS and SQL, the persistence,
indexing and query workers, and no embedding model anywhere (loading one
fails the test)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from contextlib import AsyncExitStack

import pytest
from helpers import make_settings, running, running_query, running_worker, wait_indexed

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.indexing.worker import IndexingWorker

APP = "kw-app"

pytestmark = pytest.mark.timeout(300)


def said(role: str, body: str) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=body)]))


@pytest.mark.parametrize("backend", ["embedded", pytest.param("weaviate", marks=pytest.mark.services)])
async def test_keyword_only_index_searches_and_recalls_without_a_model(
    request, backend, nats_url, sqlite_url, tmp_path, monkeypatch
):
    # Any attempt to load the local model (or ONNX Runtime) raises ImportError.
    monkeypatch.setitem(sys.modules, "memq.workers.index.embedders.minilm", None)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    s = make_settings(nats_url, sqlite_url, tmp_path)
    indexing = {"embedder": "none", "backend": backend, "batch_wait_s": 0.05, "retry_delays_s": [0.2, 0.5]}
    if backend == "weaviate":
        server = request.getfixturevalue("weaviate_server")
        indexing["weaviate"] = {
            "url": server.url,
            "grpc_port": server.grpc_port,
            "collection": f"K{uuid.uuid4().hex[:10]}",
        }
    s.indexing = type(s.indexing).model_validate({**s.indexing.model_dump(), **indexing})
    assert s.index_backend() == backend
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(s))
        indexing = await stack.enter_async_context(running(IndexingWorker(s)))
        await asyncio.wait_for(indexing.ready.wait(), 60)
        query = await stack.enter_async_context(running_query(s))
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many(
                "alice",
                "old",
                [
                    said("user", "My daughter Emma turns seven in March"),
                    said("user", "I work as a nurse at the city hospital"),
                ],
            )
            await client.append("bob", "old", said("user", "My daughter is called Zoe"))
            await client.append("alice", "new", said("assistant", "Hi again! How can I help?"))
            seq = await client.append("alice", "new", said("user", "What should I get my daughter for her birthday?"))
            await wait_indexed(client, seq)

            live = await indexing.live.backend.live()
            assert (live.model, live.dim) == ("none", 0)

            found = await client.search("alice", "daughter Emma", mode="keyword", k=3)
            assert (found.mode, found.model, found.note) == ("keyword", "none", None)
            assert "Emma" in found.results[0].content
            assert all(r.metadata["user"] == "alice" for r in found.results)
            # Vector and hybrid are answered by keyword, and the reply says why.
            for mode in ("hybrid", "vector"):
                other = await client.search("alice", "daughter Emma", mode=mode, k=3)
                assert other.mode == "keyword" and "keyword-only" in other.note, other
                assert [r.event_id for r in other.results] == [r.event_id for r in found.results]

            # Recall in a context works by keyword too (its default mode is hybrid).
            # (Each turn is indexed with the previous one, so both of alice's
            # old turns mention her daughter; bob's never comes up.)
            ctx = await client.context("alice", "new", recall_limit=2)
            assert ctx.tokens["recalled"] > 0
            recalled = [m["event"]["message"]["parts"][0]["text"] for m in ctx.context["recalled"]]
            assert any("Emma" in text for text in recalled) and not any("Zoe" in text for text in recalled)
            assert query.searcher.embedder.dim == 0
