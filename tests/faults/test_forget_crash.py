"""A persistence worker SIGKILLed while it commits forgets (memq's
forget_event), then restarted: every forgotten event ends gone from SQL and
from the stream, once, and no other event is touched."""

from __future__ import annotations

import asyncio

import nats
import pytest
import sqlalchemy as sa
from nats.js.errors import NotFoundError

from memq.contracts.client import MemoryClient
from memq.contracts.ids import scope_key
from memq.contracts.subjects import EVENTS_STREAM
from memq.workers.sql.engine import create_engine
from memq.workers.sql.models import EVENTS

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

APP = "faults-forget"


async def _stored_seqs(engine, session: str) -> list[int]:
    q = sa.select(EVENTS.c.seq).where(EVENTS.c.session_key == scope_key(APP, "u", session))
    async with engine.connect() as conn:
        return sorted((await conn.execute(q)).scalars())


async def _in_stream(js, seq: int) -> bool:
    try:
        await js.get_msg(EVENTS_STREAM, seq)
        return True
    except NotFoundError:
        return False


async def test_persistence_killed_while_forgetting(stack, fresh_nats, pg_url):
    # Batches that take a while to fill: the kill finds forgets in hand,
    # unacked (some committed to SQL, their stream messages maybe not deleted).
    st = stack(fresh_nats.url, pg_url, {"persistence": {"batch_wait_s": 0.3, "batch_size": 8}})
    st.start("persistence")
    st.workers["persistence"][0].wait_ready()
    engine = create_engine(pg_url)
    nc = await nats.connect(fresh_nats.url)
    try:
        async with await MemoryClient.connect(fresh_nats.url, app=APP) as memq:
            seqs = [await memq.append_text("u", "s", "user", f"turn {i}") for i in range(40)]
            other = await memq.append_text("u", "other", "user", "another session's turn")
            for _ in range(200):  # until the appends are committed: the forgets must find rows
                if len(await _stored_seqs(engine, "s")) == 40:
                    break
                await asyncio.sleep(0.1)
            forgotten = seqs[::2]
            for seq in forgotten:
                await memq.forget_event("u", "s", seq, missing_ok=True)  # no query service here
                if seq == forgotten[len(forgotten) // 2]:
                    st.kill("persistence")  # mid-way: some forgets published, some not yet committed
            await memq.forget_event("u", "s", other, missing_ok=True)  # another session's seq: nothing
        st.restart("persistence")
        kept = [s for s in seqs if s not in forgotten]
        for _ in range(300):
            if await _stored_seqs(engine, "s") == kept:
                break
            await asyncio.sleep(0.1)
        assert await _stored_seqs(engine, "s") == kept
        assert await _stored_seqs(engine, "other") == [other]
        js = nc.jetstream()
        for _ in range(100):  # the stream deletes follow the commit, before the ack
            if not any([await _in_stream(js, s) for s in forgotten]):
                break
            await asyncio.sleep(0.1)
        assert [s for s in forgotten if await _in_stream(js, s)] == []
        assert all([await _in_stream(js, s) for s in [*kept, other]])
        st.check_alive()
    finally:
        await nc.close()
        await engine.dispose()
