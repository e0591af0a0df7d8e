"""A client given an ``http://`` URL (the gateway's, from `memq up`'s ready
line) says that it wants NATS (issue 40): it failed with nats-py's "Name or
service not known", as if the host were wrong."""

from __future__ import annotations

import time

import pytest

from memq.contracts.client import MemoryClient
from memq.contracts.connection import NatsUnreachable, connect_nats


@pytest.mark.parametrize("url", ["http://localhost:8480", "https://memq.example.com", "nats://a:4222,http://b:8480"])
async def test_an_http_url_is_refused_at_once_and_says_why(url):
    started = time.monotonic()
    with pytest.raises(NatsUnreachable) as refused:
        await MemoryClient.connect(url, app="a")
    message = str(refused.value)
    assert "is an HTTP URL" in message and "nats://" in message and "HTTP gateway is for REST" in message
    assert "Name or service not known" not in message
    assert time.monotonic() - started < 1.5  # no connect tried (a loaded machine: generous)


async def test_the_password_of_an_http_url_is_not_repeated():
    with pytest.raises(NatsUnreachable) as refused:
        await connect_nats("http://me:secret@localhost:8480")
    assert "secret" not in str(refused.value)
