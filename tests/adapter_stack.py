"""A real memq stack for the framework adapters' tests (test_adapter_*.py):
its own nats-server, SQLite, and the persistence, indexing (keyword-only:
no model to load) and query workers, in this process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from helpers import make_settings, running, running_query, running_worker
from services import NatsServer, ServiceUnavailable

from memq.workers.indexing.worker import IndexingWorker

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@asynccontextmanager
async def memq_stack(data_dir: Path) -> AsyncIterator[str]:
    """Start the stack; yield its NATS URL."""
    try:
        nats = NatsServer()
    except ServiceUnavailable as exc:  # as conftest does: CI must never pass by skipping
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    with nats:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{data_dir}/memq.db", data_dir)
        settings.indexing = type(settings.indexing).model_validate(
            {**settings.indexing.model_dump(), "embedder": "none", "backend": "embedded", "batch_wait_s": 0.05}
        )
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(running_worker(settings))
            indexing = await stack.enter_async_context(running(IndexingWorker(settings)))
            await asyncio.wait_for(indexing.ready.wait(), 60)
            await stack.enter_async_context(running_query(settings))
            yield nats.url
