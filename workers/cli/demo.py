"""`memq demo`: publish a sample conversation through the client, read it back
from SQL and check that every event is stored exactly once, in order."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Actions, Event, Message, TextPart, ToolCallPart, ToolResultPart, new_id
from memq.workers.runtime import bus
from memq.workers.settings import Settings
from memq.workers.sql import reads
from memq.workers.sql.engine import create_engine

APP = "memq-demo"
USER = "demo-user"


def sample_conversation(n: int) -> list[Event]:
    """n events: user and assistant turns, with a tool call and its result
    every tenth turn and a state change on every user turn."""
    events: list[Event] = []
    i = 0
    while len(events) < n:
        i += 1
        if i % 10 == 0 and len(events) + 2 <= n:
            call_id = f"call-{i}"
            events.append(
                Event(
                    author="assistant",
                    message=Message(role="assistant", parts=[ToolCallPart(id=call_id, name="lookup", args={"q": i})]),
                )
            )
            events.append(
                Event(
                    author="tool",
                    message=Message(role="tool", parts=[ToolResultPart(id=call_id, name="lookup", result={"n": i})]),
                )
            )
            continue
        if i % 2:
            events.append(
                Event(
                    author="user",
                    message=Message(role="user", parts=[TextPart(text=f"Question {i}: what happened next?")]),
                    actions=Actions(state_delta={"turn": i, "user:last_seen": i, "temp:scratch": i}),
                )
            )
        else:
            events.append(
                Event(
                    author="assistant",
                    message=Message(role="assistant", parts=[TextPart(text=f"Answer {i}: the story goes on.")]),
                )
            )
    return events


@dataclass
class DemoResult:
    published: int
    stored: int
    duplicates: int
    missing: int
    out_of_order: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.published == self.stored and not (self.duplicates or self.missing or self.out_of_order)


# The demo rides out a NATS restart (`memq up` stopped and started again
# under it) as the default client does: about two minutes of reconnects, and
# each publish retried within the client's deadline (same ids: stored once).
RECONNECT_WAIT_S = 0.2  # the first connect's two tries too: a dead NATS fails within a second
RECONNECT_ATTEMPTS = 600  # x 0.2 s: two minutes, MemoryClient.connect's default patience
PROGRESS_EVERY_S = 2.0  # a line this often in a pipe, where no progress bar is drawn


def _chunks(events: list[Event], n_chunks: int = 10) -> list[list[Event]]:
    """The events in about ``n_chunks`` parts (none smaller than the client's
    pipeline of in-flight publishes): progress to show, nothing slower."""
    from memq.contracts.client import MAX_IN_FLIGHT

    size = max(MAX_IN_FLIGHT, -(-len(events) // n_chunks))
    return [events[i : i + size] for i in range(0, len(events), size)]


class _Progress:
    """Published and stored counts as bars at a terminal, as a line every
    :data:`PROGRESS_EVERY_S` in a pipe (a log, CI), where bars draw nothing."""

    def __init__(self, console: Console, total: int):
        self.console, self.total = console, total
        self.published = self.stored = 0
        self._said = (-1, -1)
        self._last_line = time.monotonic()
        self._bars: Progress | None = None
        if console.is_terminal:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bars = Progress(*columns, console=console, transient=True)
            self._pub = self._bars.add_task("published    ", total=total)
            self._sql = self._bars.add_task("stored in SQL", total=total)

    def __enter__(self) -> _Progress:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    def update(self, *, published: int | None = None, stored: int | None = None) -> None:
        self.published = self.published if published is None else published
        self.stored = self.stored if stored is None else stored
        if self._bars is not None:
            self._bars.update(self._pub, completed=self.published)
            self._bars.update(self._sql, completed=self.stored)
        elif time.monotonic() - self._last_line >= PROGRESS_EVERY_S and self._said != (self.published, self.stored):
            self.say(f"published {self.published}/{self.total}, stored in SQL {self.stored}/{self.total}")

    def say(self, line: str) -> None:
        """A line above the bars (or in the pipe)."""
        self._said, self._last_line = (self.published, self.stored), time.monotonic()
        self.console.print(line, soft_wrap=True, highlight=False, markup=False)


async def run_demo(settings: Settings, n_events: int, console: Console, timeout: float | None = None) -> DemoResult:
    if settings.database.url is not None and settings.database.url.get_secret_value() == "inmemory":
        raise SystemExit("memq demo reads SQL back: it cannot see the in-memory database of another process")
    timeout = timeout or 60 + n_events / 100
    engine = create_engine(settings.database_url())
    session = f"demo-{new_id()}"
    events = sample_conversation(n_events)
    started = time.perf_counter()
    progress = _Progress(console, n_events)

    closing = False  # nats-py calls disconnected_cb on our own close() too: that is no loss

    async def lost() -> None:
        if not closing:
            progress.say("lost the NATS connection: reconnecting (publishes in flight are retried, stored once)")

    async def back() -> None:
        progress.say("reconnected to NATS")

    # The settings' URL, credentials and TLS, as every command.
    options = {
        **bus.connect_options(settings, "demo"),
        "max_reconnect_attempts": RECONNECT_ATTEMPTS,
        "reconnect_time_wait": RECONNECT_WAIT_S,
        "disconnected_cb": lost,
        "reconnected_cb": back,
    }
    seqs: list[int] = []
    try:
        with progress:
            nc = await bus.open_connection(options)
            try:
                client = MemoryClient(nc, APP)
                await client.create_session(USER, session, state={"topic": "demo", "app:demo_runs": 1})
                watching = asyncio.create_task(_watch_sql(engine, session, progress))
                try:
                    for chunk in _chunks(events):
                        seqs += await client.append_many(USER, session, chunk)
                        progress.update(published=len(seqs))
                finally:
                    watching.cancel()
            finally:
                closing = True
                await nc.close()
            progress.say(f"published {len(seqs)} events to session {session} (seq {min(seqs)}..{max(seqs)})")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                stored = await reads.count_events(engine, APP, USER, session)
                progress.update(stored=stored)
                if stored >= n_events:
                    break
                await asyncio.sleep(0.2)
        rows = await reads.events(engine, APP, USER, session)
        state = await reads.state(engine, APP, USER, session)
    finally:
        await engine.dispose()
    elapsed = time.perf_counter() - started

    published_ids = [e.id for e in events]
    stored_ids = [r.event_id for r in rows]
    counts = Counter(stored_ids)
    known = set(published_ids)
    result = DemoResult(
        published=len(published_ids),
        stored=len(stored_ids),
        duplicates=sum(c - 1 for c in counts.values() if c > 1),
        missing=len(known - set(stored_ids)),
        out_of_order=[i for i in stored_ids if i in known] != published_ids[: len(stored_ids)],
        seconds=elapsed,
    )
    _print(console, rows, state, result)
    _print_next_steps(console, session)
    return result


async def _watch_sql(engine, session: str, progress: _Progress) -> None:
    """What SQL holds while the events are still being published."""
    while True:
        await asyncio.sleep(0.5)
        try:
            progress.update(stored=await reads.count_events(engine, APP, USER, session))
        except Exception:  # only a progress figure: the count after publishing is the one that matters
            continue


def memq_command() -> str:
    """How to call memq again: ``memq`` when that is on PATH, else the path
    this process was started with (``.venv/bin/memq`` after infra/dev.sh, in
    a shell that has not activated it), relative to the working directory
    when that is shorter."""
    invoked = Path(sys.argv[0])
    on_path = shutil.which("memq")
    if invoked.name != "memq" or (on_path and Path(on_path).resolve() == invoked.resolve()):
        return "memq"
    absolute = str(invoked.absolute())
    relative = os.path.relpath(absolute)
    return relative if len(relative) < len(absolute) else absolute


def _print_next_steps(console: Console, session: str) -> None:
    """Where the demo wrote, and the commands that show it (the CLI's app
    defaults to the demo's, so they need no --app)."""
    console.print(
        f"wrote session {session} of user {USER} in app {APP}; look at it with:", soft_wrap=True, highlight=False
    )
    memq = memq_command()
    for command in (
        f"{memq} sessions show {session} --user {USER} --events 10",
        f"{memq} history {session} --user {USER}",
        f"{memq} context {session} --user {USER}",
    ):
        console.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)


def _print(console: Console, rows: list[reads.StoredEvent], state: dict, result: DemoResult) -> None:
    table = Table(title="session, as stored in SQL (first and last events)")
    for col in ("seq", "author", "role", "content"):
        table.add_column(col)
    shown = rows if len(rows) <= 10 else rows[:5] + rows[-5:]
    for r in shown:
        parts = (r.data.get("message") or {}).get("parts", [])
        content = "; ".join(p.get("text") or f"{p['type']} {p.get('name', '')}" for p in parts)
        table.add_row(str(r.seq), r.author, r.role or "", content[:60])
    console.print(table)
    console.print(f"state: {state}")
    verdict = "[green]OK[/]" if result.ok else "[red]FAILED[/]"
    console.print(
        f"{verdict}: published {result.published}, stored {result.stored}, duplicates {result.duplicates}, "
        f"missing {result.missing}, in order: {not result.out_of_order} ({result.seconds:.1f}s)"
    )
