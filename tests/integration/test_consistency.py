"""Many agents, one truth: a read with ``consistency="any"`` sees what
another process had written and had acknowledged before the read began.

The writer is a separate OS process with its own NATS connection (as a
second agent replica would be); it prints each write's id once JetStream
has acknowledged it, and the reader reads at once. With the default
(``"own"``), the reader's ``min_seq`` knows nothing of the other process,
and most of these reads miss the write (checked below, so the test shows
what the option changes)."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest
from helpers import make_settings, running_query, running_worker

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotFound

APP = "many-agents"
USER = "u1"
SESSION = "shared"
ROUNDS = 100

# One line in, one write, one line out: "<kind> <value>" once acknowledged.
WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from memq.contracts.client import MemoryClient

    async def main(url):
        async with await MemoryClient.connect(url, app=sys.argv[2]) as client:
            loop = asyncio.get_running_loop()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                kind, value = line.split()
                if kind == "event":
                    await client.append_text(sys.argv[3], sys.argv[4], "user", value)
                elif kind == "state":
                    await client.set_state(sys.argv[3], {"user:last": value})
                elif kind == "session":
                    await client.create_session(sys.argv[3], value)
                print(kind, value, flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


class Writer:
    """The other agent process."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @classmethod
    async def start(cls, nats_url: str) -> Writer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRITER,
            nats_url,
            APP,
            USER,
            SESSION,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def write(self, kind: str, value: str) -> None:
        """Returns once the other process's write is acknowledged."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{kind} {value}\n".encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        assert line.decode().split() == [kind, value], f"the writer said {line!r}"

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), 30)


@pytest.fixture
async def stack(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(s), running_query(s), await MemoryClient.connect(nats_url, app=APP) as reader:
        writer = await Writer.start(nats_url)
        try:
            await writer.write("session", SESSION)
            yield writer, reader
        finally:
            await writer.close()


async def texts(reader: MemoryClient, consistency: str) -> list[str]:
    view = await reader.get_session(USER, SESSION, events=True, consistency=consistency)
    return [e.event["message"]["parts"][0]["text"] for e in view.events or ()]


async def test_a_read_holds_the_other_process_acknowledged_append(stack) -> None:
    writer, reader = stack
    for i in range(ROUNDS):
        await writer.write("event", f"turn-{i}")
        assert (await texts(reader, "any"))[-1] == f"turn-{i}", f"round {i}: the other process's append is missing"
    history = await reader.history(USER, SESSION, strategy={"kind": "all"}, consistency="any")
    assert len(history.events) == ROUNDS


async def test_own_consistency_is_what_misses_them(stack) -> None:
    """The control: without "any", the same reads do not wait for the other
    process, so at least some of them miss its append (on the old code every
    read was this one)."""
    writer, reader = stack
    missed = 0
    for i in range(20):
        await writer.write("event", f"turn-{i}")
        try:
            missed += f"turn-{i}" not in await texts(reader, "own")
        except NotFound:  # not even the session is committed yet
            missed += 1
    assert missed > 0


async def test_user_state_and_listings_hold_the_other_process_writes(stack) -> None:
    writer, reader = stack
    for i in range(20):
        await writer.write("state", f"v{i}")
        state = await reader.get_state(USER, consistency="any")
        assert state.get("user:last") == f"v{i}"
        await writer.write("session", f"s{i}")
        page = await reader.list_sessions(USER, limit=100, consistency="any")
        assert f"s{i}" in {info.session for info in page.sessions}
        page = await reader.list_sessions(limit=100, consistency="any")  # the app-wide listing
        assert f"s{i}" in {info.session for info in page.sessions}


async def test_a_client_can_default_to_any(stack, nats_url) -> None:
    writer, _ = stack
    async with await MemoryClient.connect(nats_url, app=APP, consistency="any") as reader:
        for i in range(10):
            await writer.write("event", f"d{i}")
            assert (await texts(reader, None))[-1] == f"d{i}"  # type: ignore[arg-type]
