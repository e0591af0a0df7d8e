"""The summarizer worker on real NATS and SQL: a 600-turn LoCoMo conversation
stays within budget from start to end with a correct chain of checkpoints;
one summary per fold however many replicas; a summarizer killed mid-summary
loses nothing and the summary comes later; failures degrade, never block."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from bench import locomo
from helpers import WorkerProcess, make_settings, running, running_query, running_worker, wait_for
from sqlalchemy import select

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.runtime.resources import Resources
from memq.workers.sql import models
from memq.workers.sql.engine import create_engine
from memq.workers.summarizer.base import SummarizerError
from memq.workers.summarizer.summarizers import ExtractiveSummarizer
from memq.workers.summarizer.worker import SummarizerWorker, checkpoint_id

APP = "sum-app"
LOCOMO = ("shared", "data", "locomo", "locomo-dev4.json")
CANDIDATES = [Path(__file__).resolve().parents[3].joinpath(*LOCOMO), Path("/work").joinpath(*LOCOMO)]
DATA = next((p for p in CANDIDATES if p.exists()), CANDIDATES[0])
CHECKPOINTS = models.Checkpoint.__table__
BUDGET = 2000

pytestmark = pytest.mark.timeout(400)


def summary_settings(nats_url, sqlite_url, tmp_path, **summarizer):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.memory = type(s.memory).model_validate({**s.memory.model_dump(), "strategy": "summary_buffer", "budget": BUDGET})
    s.summarizer = type(s.summarizer).model_validate(
        {**s.summarizer.model_dump(), "sweep_interval_s": 0.5, "retry_after_s": 0.5, "lease_ttl_s": 3, **summarizer}
    )
    return s


def text(role: str, body: str, author: str | None = None) -> Event:
    return Event(author=author or role, message=Message(role=role, parts=[TextPart(text=body)]))


async def checkpoints(settings) -> list:
    engine = create_engine(settings.database_url())
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(CHECKPOINTS).order_by(CHECKPOINTS.c.seq))).all()
    finally:
        await engine.dispose()
    return rows


def conversation_turns(n: int) -> list[Event]:
    """The longest LoCoMo conversation's first ``n`` turns; where the data is
    not on this machine, a generated conversation of the same shape (the
    properties tested hold for any conversation, so nothing is skipped)."""
    if DATA.exists():
        conv = max(locomo.load(DATA), key=lambda c: len(c.turns))
        assert len(conv.turns) >= n
        return [conv.event(t) for t in conv.turns[:n]]
    rng = random.Random(42)
    words = "we went to the lake in May and Ana painted 3 sunsets while Ben booked a trip to Lisbon for June".split()
    return [
        Event(
            id=f"gen-{i}",
            author=("Ana", "Ben")[i % 2],
            timestamp=1_683_504_000 + 600 * i,
            message=Message(
                role=("user", "assistant")[i % 2],
                parts=[TextPart(text=" ".join(rng.choices(words, k=rng.randint(8, 60))) + ".")],
            ),
        )
        for i in range(n)
    ]


async def test_600_turns_stay_within_budget_with_a_chain_of_checkpoints(nats_url, sqlite_url, tmp_path):
    s = summary_settings(nats_url, sqlite_url, tmp_path)
    events = conversation_turns(600)
    async with running_worker(s), running(SummarizerWorker(s)) as summarizer, running_query(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            over = []
            for i in range(0, len(events), 20):
                await client.append_many("u", "long", events[i : i + 20])
                ctx = await client.context("u", "long", recall_limit=0)
                if ctx.tokens["total"] > BUDGET:
                    over.append((i, ctx.tokens))
                await asyncio.sleep(0.05)  # let summaries land now and then, as in a live chat
            assert not over, over

            async def settled() -> bool:
                return not (await client.history("u", "long")).needs_summary

            await wait_for(settled, timeout=60, what="the last summary")
            ctx = await client.context("u", "long", recall_limit=0)
            assert ctx.tokens["total"] <= BUDGET and ctx.tokens["summary"] > 0
            assert ctx.context["summary"]
    rows = await checkpoints(s)
    assert len(rows) >= 3, "600 turns at a 2,000-token budget need several summaries"
    ups = [r.up_to_seq for r in rows]
    assert ups == sorted(ups) and len(set(ups)) == len(ups)  # a chain: each goes further, no duplicate
    assert all(r.up_to_seq < r.seq for r in rows)  # a summary covers only what came before it
    assert {r.checkpoint_id for r in rows} == {checkpoint_id(r.session_key, r.up_to_seq) for r in rows}
    assert summarizer.stats.checkpoints == len(rows) and summarizer.stats.failures == 0


async def test_two_replicas_make_one_checkpoint_per_fold(nats_url, sqlite_url, tmp_path):
    s = summary_settings(nats_url, sqlite_url, tmp_path, sweep_interval_s=0.2)
    events = conversation_turns(200)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(s))
        workers = [await stack.enter_async_context(running(SummarizerWorker(s))) for _ in range(2)]
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many("u", "s", events)

            async def settled() -> bool:
                return not (await client.history("u", "s")).needs_summary

            await stack.enter_async_context(running_query(s))
            await wait_for(settled, timeout=60, what="summaries")
            # both ask again at once: the lease and the msg id keep it to one
            await asyncio.gather(*(w.summarize_session(APP, "u", "s") for w in workers))
    rows = await checkpoints(s)
    ups = [r.up_to_seq for r in rows]
    assert ups and len(set(ups)) == len(ups), ups


class Failing:
    name = "failing"

    def __init__(self):
        self.calls = 0

    async def summarize(self, turns, *, previous, target_tokens):
        self.calls += 1
        raise SummarizerError("the model endpoint is down")

    async def close(self) -> None:
        pass


async def test_a_failing_summarizer_degrades_and_is_retried(nats_url, sqlite_url, tmp_path):
    s = summary_settings(nats_url, sqlite_url, tmp_path)
    failing = Failing()
    async with running_worker(s), running_query(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            statuses = []

            async def watch():
                async for status in client.watch_status("u", "s"):
                    statuses.append(status["state"])

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.1)
            async with running(SummarizerWorker(s, summarizer=failing)) as worker:
                await client.append_many("u", "s", conversation_turns(150))
                await wait_for(lambda: _at_least(lambda: failing.calls, 2), timeout=30, what="retries")
                ctx = await client.context("u", "s", recall_limit=0)
                assert ctx.tokens["total"] <= BUDGET  # token_window rules meanwhile
                assert worker.stats.failures >= 2
            assert "summarizing" in statuses and "failed" in statuses
            # a working summarizer later catches up
            async with running(SummarizerWorker(s)):
                await wait_for(lambda: _has_checkpoint(s), timeout=30, what="a checkpoint")
            watcher.cancel()


async def _at_least(value, n) -> bool:
    return value() >= n


async def _has_checkpoint(s) -> bool:
    return bool(await checkpoints(s))


class Slow:
    """The extractive summarizer, slowed down: events keep arriving mid-fold."""

    name = "slow"

    def __init__(self, delay_s: float):
        self.delay_s, self.calls, self.inner = delay_s, 0, ExtractiveSummarizer()

    async def summarize(self, turns, *, previous, target_tokens):
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return await self.inner.summarize(turns, previous=previous, target_tokens=target_tokens)

    async def close(self) -> None:
        pass


async def test_events_that_arrive_mid_fold_are_folded_without_waiting_for_the_sweep(nats_url, sqlite_url, tmp_path):
    # No sweep to fall back on: only commit notices trigger. The notices of
    # events committed while the session is being folded find it busy.
    s = summary_settings(nats_url, sqlite_url, tmp_path, sweep_interval_s=3600)
    turns = conversation_turns(300)
    slow = Slow(delay_s=1.5)
    async with running_worker(s), running_query(s), running(SummarizerWorker(s, summarizer=slow)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many("u", "s", turns[:150])
            await wait_for(lambda: _at_least(lambda: slow.calls, 1), timeout=30, what="a fold under way")
            last = (await client.append_many("u", "s", turns[150:]))[-1]

            async def settled() -> bool:
                return not (await client.history("u", "s", min_seq=last)).needs_summary

            await wait_for(settled, timeout=60, what="the events that came mid-fold to be folded")
    assert len(await checkpoints(s)) >= 2


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_the_sweep_counts_the_summary_in_the_budget(request, db, nats_url, tmp_path):
    # 1,300 tokens after the checkpoint are under the 1,700 threshold alone,
    # over it with the 600-token summary: the history says a fold is due, so
    # the sweep (the fallback for lost notices) must find the session too.
    import nats

    from memq.contracts import codec
    from memq.contracts.schemas import CheckpointSaved

    s = summary_settings(nats_url, request.getfixturevalue(db), tmp_path)
    async with running_worker(s), running_query(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            first = await client.append("u", "s", text("user", "hello"))
            nc = await nats.connect(nats_url)
            checkpoint = CheckpointSaved(app=APP, user="u", session="s", summary="word " * 600, up_to_seq=first)
            await nc.jetstream().publish(codec.subject_for(checkpoint), codec.encode(checkpoint))
            await nc.close()
            seqs = await client.append_many("u", "s", [text("user", "word " * 130) for _ in range(10)])
            # "any": the checkpoint came from another connection, not this client.
            view = await client.history("u", "s", min_seq=seqs[-1], consistency="any")
            assert view.needs_summary and view.checkpoint_seq == first
        # Opened as a process would open it (its engine from the process's
        # resources), and never started: no sweep of its own, no notices.
        worker, resources = SummarizerWorker(s), Resources(s, Counter(["sql"]))
        nc = await nats.connect(nats_url)
        try:
            await worker.open(nc, resources)
            assert await worker.sessions_over_threshold() == [(APP, "u", "s")]
        finally:
            await worker.stop()
            await resources.close()
            await nc.close()


class SilentEndpoint:
    """A TCP server that accepts and never answers: an LLM stuck mid-summary."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


async def test_a_summarizer_killed_mid_summary_loses_nothing(nats_url, sqlite_url, tmp_path):
    s = summary_settings(nats_url, sqlite_url, tmp_path)
    silent = SilentEndpoint()
    env = {
        "MEMQ_MEMORY__STRATEGY": "summary_buffer",
        "MEMQ_MEMORY__BUDGET": str(BUDGET),
        "MEMQ_SUMMARIZER__KIND": "llm",
        "MEMQ_SUMMARIZER__LLM__BASE_URL": f"http://127.0.0.1:{silent.port}/v1",
        "MEMQ_SUMMARIZER__LLM__TIMEOUT_S": "600",
        "MEMQ_SUMMARIZER__LEASE_TTL_S": "3",
        "MEMQ_SUMMARIZER__SWEEP_INTERVAL_S": "0.5",
        "MEMQ_LOG_LEVEL": "INFO",
    }
    stuck = WorkerProcess(s, tmp_path / "summarizer.log", kind="summarizer", env=env)
    try:
        async with running_worker(s), running_query(s):
            async with await MemoryClient.connect(nats_url, app=APP) as client:
                events = conversation_turns(150)
                summarizing = asyncio.Event()

                async def watch():
                    async for status in client.watch_status("u", "s"):
                        if status["state"] == "summarizing":
                            summarizing.set()

                watcher = asyncio.create_task(watch())
                await asyncio.sleep(0.1)
                stuck.start()
                await client.append_many("u", "s", events)
                await asyncio.wait_for(summarizing.wait(), 60)
                stuck.kill()  # SIGKILL while it holds the lease, mid-request
                watcher.cancel()
                assert await checkpoints(s) == []
                async with running(SummarizerWorker(s, summarizer=ExtractiveSummarizer())):
                    await wait_for(lambda: _has_checkpoint(s), timeout=30, what="the summary, later")
                    await asyncio.sleep(1.0)
                history = await client.history("u", "s", strategy={"kind": "all"})
                assert len(history.events) == len(events)  # no event lost
        rows = await checkpoints(s)
        ups = [r.up_to_seq for r in rows]
        assert len(set(ups)) == len(ups)  # no duplicate checkpoint
    finally:
        stuck.stop()
        silent.close()


def test_checkpoint_ids_are_deterministic():
    assert checkpoint_id("a" * 64, 10) == checkpoint_id("a" * 64, 10)
    assert checkpoint_id("a" * 64, 10) != checkpoint_id("a" * 64, 11)
    assert checkpoint_id("a" * 64, 10) != checkpoint_id("b" * 64, 10)


@pytest.mark.timeout(500)  # the checkpoint's wait below, and the server's start
async def test_the_llm_summarizer_makes_checkpoints_through_a_real_server(nats_url, sqlite_url, tmp_path, llama_server):
    s = summary_settings(
        nats_url,
        sqlite_url,
        tmp_path,
        kind="llm",
        max_input_tokens=600,  # the server's context is 2,048
        # Replies capped at 96 tokens: the summary's own target (hundreds of
        # tokens per chunk) took a minute of CPU on a 2-core machine and proves
        # nothing more about the path from the server to the checkpoint.
        llm={
            "base_url": llama_server.url,
            "model": llama_server.model,
            "temperature": 0,
            "timeout_s": 120,
            "max_tokens": 96,
        },
    )
    async with running_worker(s), running(SummarizerWorker(s)) as worker, running_query(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many("u", "s", conversation_turns(120))
            # A liveness bound, not a speed one: on a busy 2-core machine (a
            # parallel test run) the model's CPU share, not memq, sets the pace.
            await wait_for(lambda: _has_checkpoint(s), timeout=360, what="an LLM checkpoint")
            ctx = await client.context("u", "s", recall_limit=0)
            assert ctx.tokens["total"] <= BUDGET
    [first, *_] = await checkpoints(s)
    assert first.author == "summarizer:llm" and first.summary.strip()
    assert worker.stats.checkpoints >= 1


def test_a_long_fold_is_summarized_in_chunks():
    from memq.workers.memory.extractive import Turn
    from memq.workers.summarizer.worker import chunked

    turns = [Turn("a", "word " * 50) for _ in range(10)] + [Turn("b", "word " * 500)]
    chunks = chunked(turns, 200, None)
    assert [t for c in chunks for t in c] == turns  # all of them, in order
    assert all(len(c) <= 3 for c in chunks[:-1]) and chunks[-1] == [turns[-1]]  # a longer turn goes alone
