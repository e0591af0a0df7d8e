"""Fixtures of the framework adapters' tests (test_adapter_*.py,
test_openai_agents.py): one memq stack per module (tests/adapter_stack.py),
a client of the module's ``APP``, and a user of each test's own, since the
stack is shared by the module's tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from adapter_stack import memq_stack

from memq.contracts.client import MemoryClient


@pytest.fixture(scope="module")
async def memq_url(tmp_path_factory, request) -> AsyncIterator[str]:
    async with memq_stack(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])) as url:
        yield url


@pytest.fixture
async def memq(memq_url: str, request) -> AsyncIterator[MemoryClient]:
    async with await MemoryClient.connect(memq_url, app=request.module.APP) as client:
        yield client


@pytest.fixture
def user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"
