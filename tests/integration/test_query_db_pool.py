"""A burst of misses waits for the query worker's pooled connections rather
than opening overflow ones (issue 13): a commit notice wakes every read
waiting on it at once, and an overflow connection is closed as it comes back,
so each burst paid a connect."""

from __future__ import annotations

import asyncio

from helpers import make_settings, running_query, running_worker
from sqlalchemy import event

from memq.contracts.client import MemoryClient

APP = "pool-app"
POOL = 3
READERS = 48


async def test_a_burst_of_misses_opens_no_more_connections_than_the_pool(nats_url, pg_url, tmp_path):
    settings = make_settings(nats_url, pg_url, tmp_path)
    settings.database.pool_size = POOL
    settings.query.max_inflight = 256
    async with running_worker(settings), running_query(settings) as query:
        connects = 0

        def counted(*_):
            nonlocal connects
            connects += 1

        event.listen(query.live.engine.sync_engine, "connect", counted)
        async with await MemoryClient.connect(nats_url, app=APP, timeout=30) as client:
            seqs = [await client.append_text("u", f"s{i}", "user", f"hello {i}") for i in range(READERS)]
            # Every session is a miss, all asked at once, all woken by the same commits.
            views = await asyncio.gather(*(client.history("u", f"s{i}", min_seq=seqs[-1]) for i in range(READERS)))
        assert [v.events[-1].seq for v in views] == seqs
        assert connects <= POOL, f"{connects} connections opened for a pool of {POOL}"
