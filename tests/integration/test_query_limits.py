"""An answer too big for NATS is a typed error, not a silent wait: nats-server
drops a reply over its max_payload, so the query worker must say so itself.
(Events come in pages instead: tests/integration/test_query_paging.py.)"""

from __future__ import annotations

import pytest
from helpers import make_settings, running_query, running_worker
from services import NatsServer, running

from memq.contracts.client import MemoryClient
from memq.contracts.errors import Oversize

APP = "limits-app"


@pytest.fixture
def small_nats():
    # 8 KiB replies at most; every event alone still fits.
    with running(lambda: NatsServer(config="max_payload: 8192")) as server:
        yield server


async def test_an_answer_over_max_payload_is_a_typed_error(small_nats, sqlite_url, tmp_path):
    settings = make_settings(small_nats.url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings):
        async with await MemoryClient.connect(small_nats.url, app=APP, timeout=10) as client:
            # A state cannot be split into pages: two values of 5 KB each fit a
            # message, but not one reply together.
            await client.set_state("u", {"a": "x" * 5000}, session="s")
            seq = await client.set_state("u", {"b": "y" * 5000}, session="s")
            with pytest.raises(Oversize, match="max_payload of 8192"):
                await client.get_state("u", "s", min_seq=seq)
            # Twice: the second answer comes from the cache, and is refused the same way.
            with pytest.raises(Oversize):
                await client.get_state("u", "s", min_seq=seq)
            # Events are paged: a history of 12 KB comes back whole.
            seqs = [await client.append_text("u", "s", "user", f"{i}: " + "lorem ipsum " * 80) for i in range(12)]
            history = await client.history("u", "s", min_seq=seqs[-1])
            assert [e.seq for e in history.events] == seqs
            window = await client.history("u", "s", strategy={"kind": "buffer_window", "window": 2}, min_seq=seqs[-1])
            assert [e.seq for e in window.events] == seqs[-2:]
