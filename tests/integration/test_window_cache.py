"""A query replica's window cache answers as a fresh read does (issue 13).

The read after an append extends the window this replica read last with the
events committed since, rather than walking the session again
(:mod:`memq.workers.query.windows`). Whatever happened in between, what the
strategy keeps must be what a fresh walk gives: commits out of stream order
(several persistence replicas: the floor lags the newest event), deletes and
re-creations of the session, new summaries. Real SQL store, both engines.
"""

from __future__ import annotations

import random

import pytest

from memq.contracts.ids import scope_key
from memq.contracts.schemas import CheckpointSaved, Event, EventAppended, Message, SessionDeleted, TextPart
from memq.workers.memory.commit_plan import Incoming
from memq.workers.memory.strategies import Strategy, select
from memq.workers.persistence.store import SqlStore
from memq.workers.query.windows import WindowCache
from memq.workers.sql.engine import create_engine, migrate, reader
from memq.workers.sql.reads import NO_FILTER
from memq.workers.sql.window import load_session_window

APP, USER, SESSION = "app", "u", "s"
KEY = scope_key(APP, USER, SESSION)
STRATEGIES = [
    Strategy(kind="summary_buffer", budget=400),
    Strategy(kind="token_window", budget=300),
    Strategy(kind="buffer_window", window=4),
    Strategy(kind="buffer_window", turns=2),
    Strategy(kind="all"),
]


def appended(seq: int, rng: random.Random) -> Incoming:
    role = rng.choice(["user", "assistant"])
    words = " ".join(f"w{seq}x{i}" for i in range(rng.randint(1, 60)))
    event = Event(author="user" if role == "user" else APP, message=Message(role=role, parts=[TextPart(text=words)]))
    return Incoming(seq, EventAppended(app=APP, user=USER, session=SESSION, event=event))


class Log:
    """The stream as the test writes it: sequences handed out in order,
    committed in any order; ``floor`` is the contiguous committed prefix."""

    def __init__(self, store: SqlStore, rng: random.Random):
        self.store, self.rng = store, rng
        self.next_seq = 1
        self.pending: list[Incoming] = []
        self.done: set[int] = set()
        self.floor = 0

    def publish(self, make) -> None:
        self.pending.append(make(self.next_seq))
        self.next_seq += 1

    async def commit_some(self) -> None:
        """Commit a random part of what is pending, in random order."""
        self.rng.shuffle(self.pending)
        n = self.rng.randint(0, len(self.pending))
        batch, self.pending = self.pending[:n], self.pending[n:]
        for item in batch:
            await self.store.commit([item])
            self.done.add(item.seq)
        while self.floor + 1 in self.done:
            self.floor += 1


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url"])
@pytest.mark.parametrize("seed", range(4))
async def test_extended_windows_keep_what_a_fresh_read_keeps(request: pytest.FixtureRequest, db: str, seed: int):
    rng = random.Random(seed)
    engine = create_engine(request.getfixturevalue(db))
    try:
        await migrate(engine)
        log = Log(SqlStore(engine), rng)
        cache = WindowCache(lambda _app: log.floor, max_windows=16)
        extended = 0
        for step in range(60):
            what = rng.random()
            if what < 0.04:
                log.publish(lambda seq: Incoming(seq, SessionDeleted(app=APP, user=USER, session=SESSION)))
            elif what < 0.10 and log.floor > 2:
                up_to = rng.randint(1, log.floor)
                log.publish(
                    lambda seq, up_to=up_to: Incoming(
                        seq, CheckpointSaved(app=APP, user=USER, session=SESSION, summary=f"s{seq}", up_to_seq=up_to)
                    )
                )
            else:
                for _ in range(rng.randint(1, 6)):
                    log.publish(lambda seq: appended(seq, rng))
            await log.commit_some()
            async with reader(engine).connect() as conn:
                for strategy in STRATEGIES:
                    cached = cache._windows.get((KEY, strategy, None, NO_FILTER))
                    got = await cache.load(conn, APP, KEY, strategy, None)
                    fresh = await load_session_window(conn, KEY, strategy, None)
                    assert (got is None) == (fresh is None), f"step {step}"
                    if fresh is None:
                        continue
                    assert got is not None
                    # the path under test: extended from the cached window
                    extended += (
                        cached is not None
                        and cached.row.deleted_seq == got.row.deleted_seq
                        and cached.window.checkpoint == got.window.checkpoint
                    )
                    reserved = fresh.window.checkpoint.tokens if fresh.window.checkpoint else 0
                    want = select(fresh.window.items, strategy, reserved=reserved)
                    have = select(got.window.items, strategy, reserved=reserved)
                    assert [it.seq for it in have.items] == [it.seq for it in want.items], f"step {step} {strategy}"
                    assert got.window.checkpoint == fresh.window.checkpoint
                    # one entry per kept item in each of the window's maps, in seq order
                    seqs = [it.seq for it in got.window.items]
                    assert list(got.window.stored) == list(got.window.events) == seqs == sorted(seqs)
                    for it in have.items:
                        assert got.window.events[it.seq] == fresh.window.events[it.seq]
        assert extended > 20, "the cache was hardly ever used: the test would not see its mistakes"
    finally:
        await engine.dispose()
