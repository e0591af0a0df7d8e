"""The `memq` command: a thin layer over the library (typer + rich)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer
from nats.aio.client import Client as NATS
from rich.console import Console
from rich.json import JSON
from rich.logging import RichHandler
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError, NotFound
from memq.workers import bus
from memq.workers.settings import Settings, load_settings, mask_url

# No locals in tracebacks: they would print settings, URLs and passwords.
app = typer.Typer(
    no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False,
    help="memq: session and memory layer for LLM agents.",
)  # fmt: skip
console = Console()
err = Console(stderr=True)


class WorkerKind(str, Enum):
    persistence = "persistence"
    indexing = "indexing"
    summarizer = "summarizer"
    query = "query"


def _setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=True)],
        force=True,
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _settings() -> Settings:
    try:
        settings = load_settings()
    except Exception as exc:  # pydantic ValidationError: show it, no traceback
        err.print(f"[red]invalid settings:[/] {exc}")
        raise typer.Exit(2) from None
    _setup_logging(settings)
    return settings


def _run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)``; SIGINT/SIGTERM set ``stop`` so it can shut down cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


# Ctrl-C to exit within 10 s, whatever runs: the workers get this long to
# stop, and the embedded NATS server and the interpreter the rest.
STOP_TIMEOUT_S = 7.0


# What a command prints, as one line and no traceback, when NATS cannot be used.
NATS_FAILURES = (bus.NatsNotFound, bus.NatsUnreachable, bus.NatsTLSError)


async def _run_workers(
    settings: Settings, kinds: list[WorkerKind], stop: asyncio.Event, on_ready: Callable[[], None] | None = None
) -> None:
    """Start ``kinds`` in this process (a line per worker: the indexing
    worker's start can be slow), call ``on_ready`` once all run, then run
    until ``stop``. A NATS that cannot be reached ends it with one line, exit 1."""
    from memq.workers.health import Monitor
    from memq.workers.indexing.worker import IndexingWorker
    from memq.workers.persistence.worker import PersistenceWorker
    from memq.workers.query.service import QueryWorker
    from memq.workers.summarizer.worker import SummarizerWorker

    factories = {
        WorkerKind.persistence: PersistenceWorker,
        WorkerKind.indexing: IndexingWorker,
        WorkerKind.summarizer: SummarizerWorker,
        WorkerKind.query: QueryWorker,
    }
    # One metrics/health server for every worker of the process (if metrics.port is set);
    # up before the workers, so liveness answers during a slow start.
    monitor = Monitor(settings)
    try:
        await monitor.start([k.value for k in kinds])
    except OSError as exc:
        err.print(f"[red]cannot serve metrics on {settings.metrics.host}:{settings.metrics.port}:[/] {exc.strerror or exc}")
        raise typer.Exit(1) from None
    workers = [factories[k](settings) for k in kinds]
    started = []

    async def start_all() -> None:
        for k, w in zip(kinds, workers):
            started.append(w)  # stopped even if its start is cut short
            err.print(f"starting the {k.value} worker…", highlight=False)
            await w.start()
            monitor.watch(k.value, w)
        if on_ready is None:
            return
        # The indexing worker prepares its index in the background (a first
        # run builds it): "ready" only once search answers too.
        preparing = [w.ready for w in workers if isinstance(getattr(w, "ready", None), asyncio.Event)]
        if not all(event.is_set() for event in preparing):
            err.print("preparing the search index…", highlight=False)
            await asyncio.gather(*(event.wait() for event in preparing))
        on_ready()

    # Starting can take long on a busy machine (migrations, loading the
    # model): a signal meanwhile cancels it instead of waiting for it.
    starting = asyncio.create_task(start_all(), name="start workers")
    stopping = asyncio.create_task(stop.wait(), name="wait for a signal")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            try:
                starting.result()  # a start that failed raises here
            except NATS_FAILURES as exc:
                err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
                raise typer.Exit(1) from None
            await stopping
        err.print("stopping: finishing the batch in hand, then closing…")
    finally:
        for task in (starting, stopping):
            task.cancel()
        await asyncio.gather(starting, stopping, return_exceptions=True)
        await monitor.drain()  # /readyz: stopping; /healthz still answers while the workers stop
        try:
            # Bounded whatever a worker is doing: what is not acked by then is
            # redelivered (to a replica, or after the restart).
            async with asyncio.timeout(STOP_TIMEOUT_S):
                for w in reversed(started):
                    try:
                        await w.stop()
                    except Exception:  # one worker's failure must not keep the others running
                        logging.getLogger("memq").exception("stopping %s failed", type(w).__name__)
        except TimeoutError:
            err.print(f"[yellow]workers did not stop within {STOP_TIMEOUT_S:.0f}s; exiting (unacked work is redelivered)[/]")
        await monitor.stop()


@app.command()
def up(
    nats_port: int = typer.Option(
        4222, help="Port of the embedded nats-server; 0: any free port. A taken port is an error."
    ),
) -> None:
    """Run the whole stack in one process: embedded NATS, SQLite and every worker."""
    from memq.workers.embedded import EmbeddedError, EmbeddedNats

    settings = _settings()
    embedded = None
    if not settings.nats.url:
        embedded = EmbeddedNats(settings, port=nats_port)
        try:
            url = embedded.start()
        except EmbeddedError as exc:
            err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
            raise typer.Exit(1) from None
        if embedded.stale_files_removed:
            err.print(f"removed the run files a crashed `memq up` left in {settings.run_dir}", soft_wrap=True)
    else:
        url = _masked_nats_url(settings.nats.url)
    kinds = list(WorkerKind)
    err.print(
        f"starting memq: NATS {url}{' (embedded)' if embedded else ''}, database {_database_shown(settings)}, "
        f"data {settings.data_dir}",
        soft_wrap=True, markup=False, highlight=False,
    )  # fmt: skip

    def ready() -> None:
        console.print(
            f"memq ready: NATS {url}, data {settings.data_dir}, workers {', '.join(k.value for k in kinds)}"
            " — try `memq demo` in another terminal; Ctrl-C stops cleanly.",
            soft_wrap=True, markup=False, highlight=False,
        )  # fmt: skip

    try:
        _run_until_signal(lambda stop: _run_workers(settings, kinds, stop, on_ready=ready))
    finally:
        if embedded:
            embedded.stop()
    console.print("memq stopped; every acked event is in SQL, the rest waits in the stream.")


@app.command()
def worker(kind: WorkerKind = typer.Argument(..., help="Worker kind to run.")) -> None:
    """Run one worker kind alone (production). Several processes are replicas."""
    from memq.workers.sql.engine import is_in_memory

    settings = _settings()
    if is_in_memory(settings.database_url()):
        err.print(
            "[red]the inmemory database lives inside one process, which a lone `memq worker` cannot share:[/] "
            "run `memq up` (every worker in one process), or set MEMQ_DATABASE__URL to a SQLite file or a server",
            soft_wrap=True,
        )
        raise typer.Exit(2)
    try:
        bus.nats_url(settings)
    except bus.NatsNotFound as exc:
        err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(1) from None

    def ready() -> None:  # what an operator (or a test restarting a replica) waits for
        err.print(f"memq worker {kind.value} ready (pid {os.getpid()})", markup=False, highlight=False)

    _run_until_signal(lambda stop: _run_workers(settings, [kind], stop, on_ready=ready))


@app.command()
def init() -> None:
    """Create or update the streams and migrate the database (idempotent)."""
    from memq.workers.sql.engine import create_engine, current_revision, migrate

    settings = _settings()

    async def main() -> None:
        nc = await bus.connect(settings, "init")
        try:
            for name, outcome in (await bus.ensure_streams(nc.jetstream(), settings.streams)).items():
                console.print(f"stream {name}: {outcome}")
        finally:
            await nc.close()
        engine = create_engine(settings.database_url())
        try:
            await migrate(engine)
            console.print(f"database: at revision {await current_revision(engine)}")
        finally:
            await engine.dispose()

    try:
        asyncio.run(main())
    except NATS_FAILURES as exc:
        err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(1) from None


@app.command()
def demo(events: int = typer.Option(100, "--events", "-n", min=1, help="Events to publish.")) -> None:
    """Publish a sample conversation, read it back from SQL, check it (exit 1 if wrong)."""
    from memq.workers.demo import run_demo

    settings = _settings()
    try:
        result = asyncio.run(run_demo(settings, events, console))
    except NATS_FAILURES as exc:
        err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(1) from None
    raise typer.Exit(0 if result.ok else 1)


def _masked_nats_url(url: str) -> str:
    return ",".join(mask_url(u.strip()) for u in url.split(","))


def _database_shown(settings: Settings) -> str:
    """The database URL the workers use, password masked."""
    configured = settings.database.url.get_secret_value() if settings.database.url is not None else None
    if configured == "inmemory":
        return "inmemory (SQLite in memory, lost on restart)"
    return mask_url(settings.database_url())


@app.command("config")
def show_config() -> None:
    """Print the effective settings (secrets masked). ``nats.url`` and
    ``database.url`` are the ones in use: the configured URL, else the
    embedded server of a running `memq up` (or "not running: …"), and the
    SQLite file in the data dir."""
    settings = _settings()
    shown = settings.public_dict()
    try:
        shown["nats"]["url"] = _masked_nats_url(bus.nats_url(settings))
    except bus.NatsNotFound as exc:
        stale = (settings.run_dir / "nats.url").is_file()
        shown["nats"]["url"] = str(exc) if stale else "not running: set MEMQ_NATS__URL, or start `memq up`"
    shown["database"]["url"] = _database_shown(settings)
    console.print_json(json.dumps(shown))


# --- reading sessions back: a thin layer over MemoryClient and memq.workers.status ----

T = TypeVar("T")
DEFAULT_APP = "memq-demo"  # the app `memq demo` writes to, so the demo can be browsed without flags
AppOpt = Annotated[
    str, typer.Option("--app", "-a", envvar="MEMQ_APP", help="App id (memq-demo is the one `memq demo` writes to).")
]
UserOpt = Annotated[str, typer.Option("--user", "-u", help="User id.")]
SessionArg = Annotated[str, typer.Argument(help="Session id.")]
BudgetOpt = Annotated[int | None, typer.Option(min=1, help="Token budget. Default: the app's setting (8000).")]
_SPAN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_after(text: str) -> float:
    """``--after``: a span back from now (``30m``, ``24h``, ``7d``; s/m/h/d/w)
    or an ISO datetime (without a zone: local time), as unix seconds."""
    span = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if span:
        return time.time() - float(span[1]) * _SPAN_UNITS[span[2]]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise typer.BadParameter(f"{text!r}: use a span like 30m, 24h, 7d or an ISO datetime") from None


class MessageRole(str, Enum):
    user = "user"
    assistant = "assistant"
    system = "system"
    tool = "tool"


AfterOpt = Annotated[
    float | None,
    typer.Option(parser=parse_after, metavar="SPAN|DATETIME", help="Only events after: 24h, 30m, 7d or an ISO datetime."),
]
RoleOpt = Annotated[list[MessageRole] | None, typer.Option("--role", help="Only events with this role (repeatable).")]

sessions_app = typer.Typer(no_args_is_help=True, help="List, show and delete sessions.")
app.add_typer(sessions_app, name="sessions")


class StrategyKind(str, Enum):
    all = "all"
    none = "none"  # Hector's name for all
    buffer_window = "buffer_window"
    token_window = "token_window"
    summary_buffer = "summary_buffer"


StrategyOpt = Annotated[
    StrategyKind | None,
    typer.Option(help="Working-memory strategy (none = all). Default: the app's (summary_buffer unless configured)."),
]


def _strategy_spec(kind: StrategyKind | None, **params: int | None) -> dict[str, Any] | None:
    """The request's strategy override from the command's options: only
    those given (None: the app's strategy as it is)."""
    spec = {"kind": kind.value if kind else None, **params}
    return {k: v for k, v in spec.items() if v is not None} or None


# What each strategy's result depends on (for captions).
STRATEGY_PARAMS = {
    "buffer_window": ("window", "turns"),
    "token_window": ("budget", "preserve_recent"),
    "summary_buffer": ("budget", "threshold", "target", "min_recent"),
}


class ContextFormat(str, Enum):
    memq = "memq"
    openai = "openai"


def _with_nats(work: Callable[[NATS], Awaitable[T]]) -> T:
    """Run ``work`` on a fresh NATS connection; print a clear error and exit 1 on failure."""
    settings = _settings()

    async def quiet(exc: Exception) -> None:  # after connecting: the command's own error says it
        pass

    async def main() -> T:
        # A command should fail fast, not ride out an outage like a worker:
        # the first connect gives up after two tries 0.2 s apart.
        options = {**bus.connect_options(settings, "cli"), "max_reconnect_attempts": 1, "reconnect_time_wait": 0.2}
        nc = await bus.open_connection({**options, "error_cb": quiet})
        try:
            return await work(nc)
        finally:
            await nc.close()

    try:
        return asyncio.run(main())
    except (bus.NatsNotFound, bus.NatsUnreachable) as exc:  # the message names the URL and what to check
        err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
    except bus.NatsTLSError as exc:
        err.print(f"[red]{escape(str(exc))}[/]: check MEMQ_NATS__TLS__CA_FILE / CERT_FILE / KEY_FILE")
    except MemqError as exc:
        err.print(f"[red]{exc.code}:[/] {escape(exc.message)}")
    raise typer.Exit(1)


def _with_client(app_id: str, work: Callable[[MemoryClient], Awaitable[T]]) -> T:
    return _with_nats(lambda nc: work(MemoryClient(nc, app_id)))


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _event_text(event: dict[str, Any]) -> str:
    """One line per part: text as is, tool calls and results as arrows."""
    lines = []
    for part in (event.get("message") or {}).get("parts", []):
        kind = part.get("type")
        if kind == "text":
            lines.append(part.get("text", ""))
        elif kind == "tool_call":
            lines.append(f"→ {part.get('name')}({json.dumps(part.get('args', {}), ensure_ascii=False)})")
        elif kind == "tool_result":
            lines.append(f"← {part.get('name', '')}: {json.dumps(part.get('result'), ensure_ascii=False)}")
        else:
            lines.append(json.dumps(part, ensure_ascii=False))
    if delta := (event.get("actions") or {}).get("state_delta"):
        lines.append(f"state {json.dumps(delta, ensure_ascii=False)}")
    return _short("\n".join(lines))


def _events_table(title: str, events: list, caption: str | None = None) -> Table:
    table = Table(title=title, caption=caption)
    table.add_column("seq", justify="right")
    table.add_column("role")
    table.add_column("author")
    table.add_column("message", overflow="fold")
    table.add_column("tokens", justify="right")
    for stored in events:
        message = stored.event.get("message") or {}
        table.add_row(
            str(stored.seq),
            message.get("role", "-"),
            Text(stored.event.get("author", "")),
            Text(_event_text(stored.event)),
            str(stored.tokens),
        )
    return table


@sessions_app.command("list")
def sessions_list(
    app_id: AppOpt = DEFAULT_APP,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's sessions.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500, help="Sessions per page.")] = 50,
    every: Annotated[bool, typer.Option("--all", help="Follow the cursors through every page.")] = False,
) -> None:
    """List sessions, most recently updated first (one page unless --all)."""

    async def fetch(client: MemoryClient) -> tuple[list, bool]:
        if not every:
            page = await client.list_sessions(user, limit=limit)
            return page.sessions, page.next_cursor is not None
        found = []
        with err.status("fetching sessions…") as progress:
            async for info in client.iter_sessions(user, page_size=limit):
                found.append(info)
                if len(found) % limit == 0:
                    progress.update(f"fetching sessions… {len(found)}")
        return found, False

    found, more = _with_client(app_id, fetch)
    table = Table(title=f"sessions of {app_id}" + (f", user {user}" if user else ""))
    for column in ("user", "session", "updated", "created", "last seq"):
        table.add_column(column, justify="right" if column == "last seq" else "left")
    for s in found:
        table.add_row(Text(s.user), Text(s.session), _when(s.updated_at), _when(s.created_at), str(s.last_seq))
    table.caption = f"{len(found)} session{'' if len(found) == 1 else 's'}" + (": more with --all" if more else "")
    console.print(table)


@sessions_app.command("show")
def sessions_show(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    events: Annotated[int, typer.Option("--events", "-e", min=0, help="Show the last N events.")] = 0,
    after: AfterOpt = None,
    role: RoleOpt = None,
) -> None:
    """Show a session: its ids, times and merged state (app: and user: keys prefixed).
    With --after or --role, also the events that pass them (the last N with --events)."""
    roles = [r.value for r in role or ()]
    view = _with_client(
        app_id, lambda c: c.get_session(user, session, num_recent_events=events or None, after=after, roles=roles)
    )
    console.print(
        Panel.fit(
            Text(
                f"app       {view.app}\nuser      {view.user}\nsession   {view.session}\n"
                f"created   {_when(view.created_at)}\nupdated   {_when(view.updated_at)}\nlast seq  {view.last_seq}"
            ),
            title="session",
        )
    )
    console.print(Panel.fit(JSON.from_data(view.state), title="state"))
    if view.events is not None and (view.events or after is not None or roles):
        console.print(_events_table(f"{'last ' if events else ''}{len(view.events)} events", view.events))


@sessions_app.command("delete")
def sessions_delete(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a session everywhere: SQL, index, cache and the stream itself.
    A session that does not exist is an error (exit 1): nothing is published."""

    async def exists(client: MemoryClient) -> bool:
        try:
            await client.get_session(user, session)
        except NotFound:
            return False
        return True

    if not _with_client(app_id, exists):
        err.print(
            f"[red]no session {escape(repr(session))} of user {escape(repr(user))} in app {escape(repr(app_id))}:[/] "
            "nothing deleted (see `memq sessions list`)",
            soft_wrap=True,
        )
        raise typer.Exit(1)
    if not yes:
        typer.confirm(f"Delete session {session!r} of user {user!r} in app {app_id!r} for good?", abort=True)
    seq = _with_client(app_id, lambda c: c.delete_session(user, session))
    console.print(f"delete published at seq {seq}: the workers remove the session everywhere.")


@app.command()
def history(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    strategy: StrategyOpt = None,
    budget: BudgetOpt = None,
    window: Annotated[int | None, typer.Option(min=1, help="buffer_window: last N messages (default 20).")] = None,
    after: AfterOpt = None,
    role: RoleOpt = None,
) -> None:
    """Show a session's history through a working-memory strategy, with token counts.
    --after/--role pick events first; the strategy then windows those."""
    spec = _strategy_spec(strategy, budget=budget, window=window)
    roles = [r.value for r in role or ()]
    view = _with_client(app_id, lambda c: c.history(user, session, strategy=spec, after=after, roles=roles))
    if view.summary:
        console.print(Panel(Text(view.summary), title=f"summary up to seq {view.checkpoint_seq}"))
    kind = view.strategy.get("kind")
    params = ", ".join(f"{k} {view.strategy[k]}" for k in STRATEGY_PARAMS.get(kind, ()) if view.strategy.get(k))
    caption = f"strategy {kind}{f' ({params})' if params else ''}: {view.tokens} tokens"
    if view.over_budget:
        caption += f", over the budget of {view.strategy.get('budget')}"
    elif view.needs_summary:
        caption += ", over the summary threshold"
    console.print(_events_table(f"history of {session}", view.events, caption))


@app.command()
def context(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    format: Annotated[ContextFormat, typer.Option(help="memq (with per-part details) or openai.")] = ContextFormat.memq,
    strategy: StrategyOpt = None,
    budget: BudgetOpt = None,
    instruction: Annotated[
        str | None, typer.Option(help="Instruction template rendered from state, e.g. 'Answer in {user:language}.'")
    ] = None,
) -> None:
    """Show the context an agent would send to its model: token counts per part, then the messages.
    It fits the budget unless the strategy is all/none or buffer_window; then it says it is over."""
    spec = _strategy_spec(strategy, budget=budget)
    view = _with_client(
        app_id, lambda c: c.context(user, session, strategy=spec, format=format.value, instruction=instruction)
    )
    tokens = Table(title=f"context of {session}")
    tokens.add_column("part")
    tokens.add_column("tokens", justify="right")
    for part, count in view.tokens.items():
        tokens.add_row(part, str(count), style="bold" if part == "total" else None)
    console.print(tokens)
    if view.context:  # memq format: how it was counted
        console.print(f"strategy {view.context['strategy']['kind']}, encoding {view.context.get('encoding')}")
    if view.over_budget:  # whatever the format
        console.print(f"[bold red]{escape(view.note or f'over the budget of {view.budget}')}[/]")
    else:
        console.print(f"within the budget of {view.budget}" + (f": {escape(view.note)}" if view.note else ""))
    messages = Table(title="messages")
    messages.add_column("#", justify="right")
    messages.add_column("role")
    messages.add_column("content", overflow="fold")
    for i, message in enumerate(view.messages, 1):
        rest = {k: v for k, v in message.items() if k not in ("role", "content")}
        content = message.get("content") or ""
        if rest:  # tool calls, tool_call_id
            content = f"{content}\n{json.dumps(rest, ensure_ascii=False)}".strip()
        messages.add_row(str(i), message.get("role", ""), Text(_short(content, 2000)))
    console.print(messages)


class SearchModeOpt(str, Enum):
    hybrid = "hybrid"
    keyword = "keyword"
    vector = "vector"


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    session: Annotated[str | None, typer.Option("--session", "-s", help="Only this session.")] = None,
    mode: Annotated[SearchModeOpt, typer.Option(help="keyword (BM25), vector, or hybrid.")] = SearchModeOpt.hybrid,
    k: Annotated[int, typer.Option("--k", "-k", min=1, max=100, help="Results.")] = 10,
    author: Annotated[list[str] | None, typer.Option(help="Only these authors (repeatable).")] = None,
    role: Annotated[list[str] | None, typer.Option(help="Only these roles (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Search a user's long-term memory, best first."""
    found = _with_client(
        app_id,
        lambda c: c.search(user, query, session=session, mode=mode.value, k=k, authors=author or (), roles=role or ()),
    )
    if as_json:
        console.print_json(found.model_dump_json())
        return
    table = Table(title=f"memories of {user} for {query!r}", caption=f"{mode.value if not found.note else found.mode}, {found.model}")
    for column in ("score", "when", "session", "author", "content"):
        table.add_column(column, justify="right" if column == "score" else "left", overflow="fold")
    for r in found.results:
        table.add_row(f"{r.score:.3f}", _when(r.timestamp), Text(r.session_id), Text(r.author), Text(_short(r.content)))
    if found.note:
        err.print(f"[yellow]note:[/] {found.note}")
    console.print(table)


index_app = typer.Typer(no_args_is_help=True, help="Inspect and rebuild the long-term memory index.")
app.add_typer(index_app, name="index")


class RebuildSource(str, Enum):
    stream = "stream"
    sql = "sql"


@index_app.command("rebuild")
def index_rebuild(
    app_id: Annotated[str | None, typer.Option("--app", "-a", help="Only this app (the rest is copied).")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user (needs --app).")] = None,
    source: Annotated[RebuildSource, typer.Option(help="Replay the event stream, or read SQL.")] = RebuildSource.stream,
) -> None:
    """Rebuild the index into a fresh generation while the live one serves, then switch."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from memq.workers.indexing.backends import open_backend
    from memq.workers.indexing.embedders import open_embedder
    from memq.workers.indexing.indexer import make_indexer
    from memq.workers.indexing.rebuild import rebuild
    from memq.workers.sql.engine import create_engine

    if user is not None and app_id is None:
        err.print("[red]--user needs --app[/]")
        raise typer.Exit(2)
    settings = _settings()

    async def work(nc: NATS):
        backend = open_backend(settings)
        await backend.open()
        embedder = await open_embedder(settings.indexing)
        engine = create_engine(settings.database_url())  # the SQL source, and each turn's previous one
        indexer = make_indexer(settings, backend, embedder, nc.jetstream(), engine=engine)
        columns = (
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>8.0f} msg/s"), TimeRemainingColumn(),
        )  # fmt: skip
        try:
            with Progress(*columns, console=err) as bar:
                task = bar.add_task(f"rebuilding ({embedder.model})", total=None, rate=0.0)
                started = asyncio.get_running_loop().time()

                def progress(done: int, total: int) -> None:
                    elapsed = asyncio.get_running_loop().time() - started
                    bar.update(task, completed=done, total=total, rate=done / elapsed if elapsed > 0 else 0.0)

                return await rebuild(
                    settings, nc.jetstream(), indexer, source=source.value, app=app_id, user=user,
                    engine=engine if source is RebuildSource.sql else None, progress=progress,
                )  # fmt: skip
        finally:
            await backend.close()
            await embedder.close()
            await engine.dispose()

    try:
        result = _with_nats(work)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    console.print(
        f"index {result.generation} is live: {result.docs} docs from {result.replayed} messages"
        + (f" (+{result.copied} copied)" if result.copied else "")
        + f", {result.model}, in {result.seconds:.1f}s"
    )


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show consumer lag per worker kind, live worker instances and dead letters."""
    from memq.workers.status import collect_status, render

    settings = _settings()
    report = _with_nats(lambda nc: collect_status(nc, settings.streams))
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        render(report, console)


dlq_app = typer.Typer(no_args_is_help=True, help="Inspect dead letters and send them back once fixed.")
app.add_typer(dlq_app, name="dlq")


def _dlq_filter(worker: str | None, code: str | None, seqs: list[int] | None):
    from memq.workers.dlq import DeadLetterFilter

    return DeadLetterFilter(worker=worker, code=code, seqs=frozenset(seqs) if seqs else None)


@dlq_app.command("list")
def dlq_list(
    worker: Annotated[str | None, typer.Option("--worker", "-w", help="Only this worker's dead letters.")] = None,
    code: Annotated[str | None, typer.Option("--code", "-c", help="Only this error code, e.g. oversize.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most this many.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """List dead letters, oldest first, with why each was given up on."""
    from memq.workers.dlq import list_dead_letters, summarize

    settings = _settings()
    where = _dlq_filter(worker, code, None)
    letters = _with_nats(lambda nc: list_dead_letters(nc.jetstream(), settings.streams.dlq, where, limit))
    if as_json:
        console.print_json(json.dumps([letter.to_dict() for letter in letters]))
        return
    table = Table(title=f"dead letters in {settings.streams.dlq}" + (f" (first {limit})" if len(letters) == limit else ""))
    for column in ("seq", "time", "worker", "code", "reason", "original subject", "orig seq", "bytes"):
        table.add_column(column, justify="right" if column in ("seq", "orig seq", "bytes") else "left")
    for letter in letters:
        table.add_row(
            str(letter.seq),
            str(letter.time or "")[:19],
            letter.worker,
            letter.code,
            escape(_short(letter.reason, 120)),
            escape(letter.original_subject),
            str(letter.original_seq or ""),
            str(letter.size),
        )
    if not letters:
        table.caption = "no dead letters"
    else:
        table.caption = ", ".join(f"{w}/{c}: {n}" for w, c, n in summarize(letters))
    console.print(table)


@dlq_app.command("replay")
def dlq_replay(
    seqs: Annotated[list[int] | None, typer.Argument(help="DLQ sequence numbers to replay (see `memq dlq list`).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Replay every dead letter that matches the filters.")] = False,
    worker: Annotated[str | None, typer.Option("--worker", "-w", help="Only this worker's dead letters.")] = None,
    code: Annotated[str | None, typer.Option("--code", "-c", help="Only this error code.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Leave the dead letters in the DLQ after replaying.")] = False,
) -> None:
    """Publish dead letters again on their original subjects, then delete them.

    Fix the cause first (a setting, a worker bug, the database): a message
    that fails again is dead-lettered again, with its new reason.
    """
    from memq.workers.dlq import replay_dead_letters

    if not seqs and not all_:
        err.print("[red]name the dead letters to replay[/] (`memq dlq replay 3 7`), or pass --all (with --worker/--code filters)")
        raise typer.Exit(2)
    settings = _settings()
    where = _dlq_filter(worker, code, seqs)

    def replayed(letter) -> None:
        console.print(f"replayed dead letter {letter.seq} ({letter.code}) onto {escape(letter.original_subject)}")

    result = _with_nats(
        lambda nc: replay_dead_letters(
            nc.jetstream(), settings.streams.dlq, settings.streams.events, where, keep=keep, on_replayed=replayed
        )
    )
    for seq, why in result.skipped:
        err.print(f"[yellow]skipped dead letter {seq}:[/] {escape(why)}")
    missing = sorted(set(seqs or ()) - set(result.replayed) - {seq for seq, _ in result.skipped})
    if missing:
        err.print(f"[yellow]no such dead letter (or filtered out):[/] {', '.join(map(str, missing))}")
    console.print(f"{len(result.replayed)} replayed" + ("" if keep else ", deleted from the DLQ"))
    if result.skipped or missing:
        raise typer.Exit(1)


# --- NATS accounts: per-app users and permissions (memq.workers.security) ------------

nats_app = typer.Typer(no_args_is_help=True, help="NATS server configuration for memq.")
app.add_typer(nats_app, name="nats")


@nats_app.command("accounts")
def nats_accounts(
    apps: Annotated[list[str], typer.Option("--app", "-a", help="An app that gets its own user (repeatable).")],
    out: Annotated[str, typer.Option("--out", "-o", help="The accounts config to write (`include` it in nats.conf).")] = "accounts.conf",
    secrets_path: Annotated[
        str | None, typer.Option("--secrets", help="Where the passwords go (mode 0600). Default: <out>.secrets.json")
    ] = None,
    env_passwords: Annotated[
        bool, typer.Option("--env-passwords", help="Generate no passwords: the server reads each from $MEMQ_NATS_PASSWORD_<USER>.")
    ] = False,
    admin: Annotated[bool, typer.Option("--admin/--no-admin", help="An operators' user (memq init, status, dlq).")] = True,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Write a nats-server accounts config: a `workers` user, an `admin` user and
    one user per app that may touch only that app's subjects. Passwords go to
    a 0600 file, never to the terminal."""
    import os
    from pathlib import Path

    from memq.workers import security

    try:
        names = security.user_names(apps, admin=admin)
        plain, hashed = security.generate_passwords(names)
        stored = {n: "$" + security.env_var(n) for n in names} if env_passwords else hashed
        memq_users, system_users = security.build_users(apps, stored, admin=admin)
    except ValueError as exc:  # InvalidId is one too
        err.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    targets = [Path(out), Path(secrets_path or f"{out}.secrets.json")]
    if not force and (taken := [str(p) for p in targets if p.exists()]):
        err.print(f"[red]{', '.join(taken)} exists[/]: use --force to overwrite")
        raise typer.Exit(1)
    header = "generated by `memq nats accounts`: " + (
        "each password (a quoted bcrypt hash) from the server's environment" if env_passwords else "bcrypt hashes"
    )
    Path(out).write_text(security.render_accounts(memq_users, system_users, header=header))
    doc = security.credentials_document(memq_users, system_users, plain, hashed)
    tmp = targets[1].with_name(f".{targets[1].name}.tmp")
    tmp.unlink(missing_ok=True)
    # Created 0600 before a byte is written: the passwords are never readable by others.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, targets[1])
    console.print(f"wrote {out}, and the passwords to {targets[1]} (mode 0600): keep that out of git", soft_wrap=True)
    if env_passwords:
        console.print("the server needs (server_env in that file): " + " ".join(doc["server_env"]), soft_wrap=True)
    console.print("users: " + ", ".join(u.name for u in memq_users + system_users), soft_wrap=True)


if __name__ == "__main__":
    app()
