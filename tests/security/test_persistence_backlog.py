"""One app's persistence backlog does not stall another app's turns (issue
38, finding 3, the persistence half), on a multi-tenant deployment.

Every app's events go through one stream and one durable persistence
consumer, and read-your-writes waits on its commit floor, which moves only
over a contiguous run of the whole stream: B's read waits for A's earlier
huge events to commit. App A, with its own credentials, publishes 60 events
as large as the server lets it (a few seconds of commits: counting their
tokens is most of it); app B keeps doing an agent's turn with the default
client, an append and then a read of its session (``history``, then
``context``; now and then the first turn of a new session). B's reads carry B's own writes (:mod:`memq.contracts.carry`),
kept until a reply says they are committed, and are answered without
waiting for A's backlog; before, a carried write was dropped after a second
and the read then waited for the backlog, and failed ``NotCommitted``.

The stack is the package's (accounts per app, the workers as ``workers``)
without the summarizer, which production runs in a process of its own: its
cost on A's huge turns is another matter than the commit floor.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import nats
import pytest
from helpers import make_settings, running
from pydantic import SecretStr
from services import NatsServer
from services import running as running_service

from memq.contracts.client import HEADER_ROOM, MemoryClient
from memq.contracts.queries import MAX_CARRIED
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers import security
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.query.worker import QueryWorker

from .conftest import A, B, Tenants

pytestmark = pytest.mark.timeout(240)

HUGE_EVENTS = 60
IDLE_TURNS = 12  # of each read
# B's turns while A's backlog lasts, one write each: within what a client
# carries (MAX_CARRIED writes), however long the backlog takes on this VM.
# More writes than that in one backlog make the read wait for it again.
LOADED_TURNS = 24
# An agent's turn waits for its model between a read and the next append:
# 100 ms is a fast one.
THINK_S = 0.1
SLACK_S = 1.0  # over the idle p99 (see the test)
PROSE = "A kept talking about nothing in particular while the queue grew longer. "


@pytest.fixture
async def stack(tmp_path) -> AsyncIterator[Tenants]:
    """The package's multi-tenant stack, persistence and query workers only."""
    names = security.user_names([A, B])
    passwords, hashed = security.generate_passwords(names)
    memq_users, system_users = security.build_users([A, B], hashed)
    config = security.render_accounts(memq_users, system_users)
    with running_service(functools.partial(NatsServer, config=config)) as server:
        s = make_settings(server.url, f"sqlite+aiosqlite:///{tmp_path}/memq.db", tmp_path)
        s.nats = s.nats.model_copy(update={"user": security.WORKERS, "password": SecretStr(passwords["workers"])})
        async with AsyncExitStack() as exits:
            for worker in (PersistenceWorker(s), QueryWorker(s)):
                await exits.enter_async_context(running(worker))
            admin = await nats.connect(server.url, user=security.ADMIN, password=passwords["admin"])
            exits.push_async_callback(admin.close)
            yield Tenants(server, passwords, s, admin)


def huge_events(client: MemoryClient, count: int) -> list[Event]:
    """``count`` events of prose, each as large as ``client`` lets its app
    publish (to a few bytes: an event's timestamp varies in length)."""

    def event(i: int, size: int) -> Event:
        text = (f"{i:03d} " + PROSE * (size // len(PROSE) + 1))[:size]
        return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))

    limit = min(client.max_message_bytes, client.nc.max_payload - HEADER_ROOM)
    envelope = len(client._prepare_events("mallory", "backlog", [event(0, 0)])[0][1])
    return [event(i, limit - envelope - 16) for i in range(count)]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def turn(b: MemoryClient, n: int, read: str, session: str = "chat") -> tuple[float, int]:
    """One agent turn of B's: append, then read (default client: no
    ``min_seq``) and find the append in it; its latency and seq."""
    word = f"turn-{n}"
    started = time.perf_counter()
    seq = await b.append_text("bob", session, "user", word)
    if read == "history":
        last = (await b.history("bob", session)).events[-1].event["message"]["parts"][0]["text"]
    else:
        last = (await b.context("bob", session, recall_limit=0)).messages[-1]["content"]
    elapsed = time.perf_counter() - started
    assert word in last, f"B's {read} after its append ends with {last[:80]!r}, not its write {word!r}"
    return elapsed, seq


async def test_a_persistence_backlog_does_not_stall_bs_turns(stack):
    assert LOADED_TURNS < MAX_CARRIED
    s = stack.settings
    admin_js = stack.admin.jetstream()

    async def floor() -> int:
        info = await admin_js.consumer_info(s.streams.events, s.persistence.durable)
        return info.ack_floor.stream_seq

    a = await stack.client(A)
    b = await stack.client(B)
    try:
        idle: dict[str, list[float]] = {"history": [], "context": []}
        for n in range(IDLE_TURNS):
            for read in idle:
                idle[read].append((await turn(b, n * 2 + (read == "context"), read))[0])
                await asyncio.sleep(THINK_S)

        last_a = max(await a.append_many("mallory", "backlog", huge_events(a, HUGE_EVENTS)))
        loaded: dict[str, list[float]] = {"history": [], "context": []}
        ahead = 0  # B's reads answered while its write waited behind A's backlog
        for n in range(1000, 1000 + LOADED_TURNS):
            if await floor() >= last_a:
                break
            read = "history" if n % 2 == 0 else "context"
            # Every few turns B's agent starts a conversation: a session SQL
            # does not hold yet, whose first turn is carried too.
            session = f"new-{n}" if n % 6 == 5 else "chat"
            elapsed, seq = await turn(b, n, read, session)
            loaded[read].append(elapsed)
            if await floor() < seq:  # still uncommitted after the read: it was answered without the commit
                ahead += 1
            await asyncio.sleep(THINK_S)
        assert ahead >= 3, f"only {ahead} of B's reads ran while A's backlog held its write back: no backlog to test"
        for read, times in idle.items():
            # The target is 2x the idle p99 (the tenants benchmark
            # measures it). On a shared 2-core VM, with A's commits and counts
            # on the same cores as B's turns, one turn in a dozen took
            # 220-330 ms at load 8-10 (idle p99 40-110 ms), and 846 ms once
            # in a parallel run of the whole suite: 1 s of slack besides. A
            # read that waits for A's backlog instead takes its whole
            # wait_ms (2 s) or fails, so the bound still tells them apart.
            bound = max(2 * p99(times), p99(times) + SLACK_S)
            assert p99(loaded[read]) <= bound, (
                f"B's {read} turns took {p99(loaded[read]) * 1000:.0f} ms (p99) behind A's backlog, "
                f"over max(2x, +{SLACK_S * 1000:.0f} ms) of their idle p99 ({p99(times) * 1000:.0f} ms)"
            )
    finally:
        await a.close()
        await b.close()


async def test_counting_huge_events_leaves_the_event_loop_free(stack):
    """`memq up` runs every worker on one event loop (the fixture too).
    Counting the tokens of a MB of whitespace takes ~0.9 s: committed
    inline, a batch of A's such events held the loop, and with it B's
    queries, for seconds; counted in a thread, the loop keeps turning."""
    a = await stack.client(A)
    worst = 0.0

    async def watch() -> None:
        nonlocal worst
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            worst = max(worst, time.perf_counter() - started - 0.01)

    try:
        limit = min(a.max_message_bytes, a.nc.max_payload - HEADER_ROOM)
        blank = [
            Event(author="user", message=Message(role="user", parts=[TextPart(text=f"{i} " + " " * (limit - 700))]))
            for i in range(8)
        ]
        last = max(await a.append_many("mallory", "blank", blank))
        watcher = asyncio.create_task(watch())
        js = stack.admin.jetstream()
        s = stack.settings
        while (await js.consumer_info(s.streams.events, s.persistence.durable)).ack_floor.stream_seq < last:
            await asyncio.sleep(0.05)
        watcher.cancel()
        assert worst < 1.0, f"the event loop stood still for {worst:.2f}s while A's blank events were committed"
    finally:
        await a.close()
