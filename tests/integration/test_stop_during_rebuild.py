"""Stopping while the index is being rebuilt (issue 11): Ctrl-C ends `memq up`
within 10 s even mid-rebuild, the unfinished generation never goes live, and
the next start builds the index complete, leaving no half-built generation
behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from helpers import running, wait_for

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.backends.embedded import EmbeddedIndex
from memq.workers.index.embedders.minilm import DIM, MODEL
from memq.workers.indexing.rebuild import FETCH
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.runtime import bus
from memq.workers.settings import Settings

MEMQ = str(Path(sys.prefix) / "bin" / "memq")
APP = "rebuild-stop"
# Three replay batches (rebuild.FETCH each): Ctrl-C comes once the first is
# indexed, so a full batch is in flight and a third is still to come. More
# events (there were 800) test nothing more and take longer to embed.
EVENTS = 2 * FETCH + FETCH // 4
STOP_WITHIN_S = 10.0

pytestmark = pytest.mark.timeout(600)

WORDS = "the agent remembers what the user said about travel plans budgets and favourite places".split()


def sentence(i: int) -> str:
    # ~60 words (~70 tokens), as a real conversation turn: with its previous
    # turn as context, embedding one replay batch (256) takes seconds
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(60)) + f" (turn {i})"


async def publish(nats_url: str, settings: Settings) -> None:
    nc = await nats.connect(nats_url)
    try:
        await bus.ensure_streams(nc.jetstream(), settings.streams)
    finally:
        await nc.close()
    async with await MemoryClient.connect(nats_url, app=APP) as client:
        for s in range(4):
            events = [
                Event(author="user", message=Message(role="user", parts=[TextPart(text=sentence(i))]))
                for i in range(s, EVENTS, 4)
            ]
            await client.append_many("u", f"s{s}", events)


async def stream_messages(nats_url: str, settings: Settings) -> int:
    nc = await nats.connect(nats_url)
    try:
        return (await nc.jetstream().stream_info(settings.streams.events)).state.messages
    finally:
        await nc.close()


class Up:
    """`memq up` on an outside NATS server, as a child process."""

    def __init__(self, nats_url: str, data_dir: Path):
        self.data_dir = data_dir
        self.log = data_dir / "up.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        self.env.update(
            MEMQ_DATA_DIR=str(data_dir), MEMQ_NATS__URL=nats_url, MEMQ_LOG_LEVEL="INFO", COLUMNS="300"
        )  # no wrapped log lines
        self.proc: subprocess.Popen | None = None
        self._offset = 0

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([MEMQ, "up"], env=self.env, stdout=log, stderr=log)

    def output(self) -> str:
        """What this run has logged so far."""
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            return f.read().decode(errors="replace")

    async def wait_logged(self, text: str, timeout: float) -> None:
        async def logged() -> bool:
            assert self.proc.poll() is None, self.output()
            return text in self.output()

        await wait_for(logged, timeout=timeout, what=f"{text!r} in the log")

    def interrupt(self) -> tuple[int, float]:
        """Ctrl-C; (exit status, seconds it took). SIGKILL after 60 s."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def up(nats_url, tmp_path):
    u = Up(nats_url, tmp_path / "memq-data")
    yield u
    u.kill()


async def open_index(path: Path) -> EmbeddedIndex:
    index = EmbeddedIndex(path)
    await index.open()
    return index


async def test_ctrl_c_mid_rebuild_stops_within_10s_and_the_restart_completes(nats_url, up):
    settings = Settings(data_dir=up.data_dir, nats={"url": nats_url})
    await publish(nats_url, settings)
    up.start()  # the stream holds the events and there is no index yet: memq up rebuilds it
    await up.wait_logged("building it from the stream", timeout=180)
    index = await open_index(settings.data_dir / "index.db")
    try:

        async def mid_rebuild() -> bool:
            gens = await index.generations()
            return bool(gens) and await index.count(generation=gens[-1].generation) >= 100

        await wait_for(mid_rebuild, timeout=180, what="the rebuild to be under way")
        assert "rebuilt" not in up.output(), "the rebuild finished before Ctrl-C: nothing was tested"

        rc, took = up.interrupt()
        print(f"Ctrl-C mid-rebuild: exited {rc} after {took:.1f}s")
        assert took <= STOP_WITHIN_S, f"Ctrl-C took {took:.1f}s mid-rebuild\n{up.output()}"
        assert rc == 0, up.output()
        assert await index.live() is None  # the unfinished generation never went live

        up.start()

        async def complete() -> bool:
            # every message of the stream is one doc: the events and the summarizer's checkpoints
            if await index.live() is None:
                return False
            return await index.count() == await stream_messages(nats_url, settings)

        await wait_for(complete, timeout=400, what="every message of the stream in the rebuilt index")
        assert await index.count() >= EVENTS
        assert [g.generation for g in await index.generations()] == [(await index.live()).generation]
        rc, took = up.interrupt()
        assert rc == 0 and took <= STOP_WITHIN_S, f"exit {rc} after {took:.1f}s\n{up.output()}"
    finally:
        await index.close()


async def test_a_generation_left_by_a_killed_rebuild_is_dropped_at_the_next_start(nats_url, tmp_path):
    """A rebuild that could not clean up (SIGKILL) leaves a generation that is
    not live; the next rebuild drops it and builds a fresh one."""
    settings = Settings(
        data_dir=tmp_path,
        nats={"url": nats_url},
        indexing={"context_turns": 0, "retry_delays_s": [0.2], "batch_wait_s": 0.05},
    )
    nc = await nats.connect(nats_url)
    await bus.ensure_streams(nc.jetstream(), settings.streams)
    await nc.close()
    async with await MemoryClient.connect(nats_url, app=APP) as client:
        await client.append_many(
            "u", "s", [Event(message=Message(role="user", parts=[TextPart(text=sentence(i))])) for i in range(20)]
        )
    index = await open_index(tmp_path / "index.db")
    try:
        left = await index.create_generation(MODEL, DIM)  # as a killed rebuild leaves it
        async with running(IndexingWorker(settings)) as worker:
            await asyncio.wait_for(worker.ready.wait(), 120)
        live = await index.live()
        assert live is not None and live.generation != left.generation
        assert [g.generation for g in await index.generations()] == [live.generation]
        assert await index.count() == 20
    finally:
        await index.close()
