"""Running memq: `memq up` (the whole stack in one process), `memq worker`
(one kind, a replica), `memq init`, `memq demo` and `memq config`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from memq.workers.cli.common import (
    _database_shown,
    _masked_nats_url,
    _settings,
    _with_nats,
    app,
    console,
    err,
    nats_failures,
)
from memq.workers.runtime.kinds import KINDS

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from memq.workers.settings import Settings

# The kinds `memq worker` takes, from the registry (in start order). mypy
# cannot list the members of an Enum built at run time; typer needs an Enum.
WorkerKind = Enum("WorkerKind", {name: name for name in KINDS}, type=str)  # type: ignore[misc]


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


async def _run_workers(
    settings: Settings,
    kinds: list[WorkerKind],
    stop: asyncio.Event,
    on_ready: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run ``kinds`` in this process as one FastStream app (:mod:`memq.workers.runtime.app`;
    a line per worker as it starts: the indexing worker's start can be slow),
    call ``on_ready`` once all run, then run until ``stop``. A NATS that
    cannot be reached ends it with one line, exit 1."""
    from memq.workers.runtime.app import assemble
    from memq.workers.runtime.gc_tuning import settle_after_start
    from memq.workers.runtime.health import Monitor

    names = [k.value for k in kinds]
    # One metrics/health server for every worker of the process (if metrics.port is set);
    # up before the workers, so liveness answers during a slow start.
    monitor = Monitor(settings)
    try:
        await monitor.start(names)
    except OSError as exc:
        err.print(
            f"[red]cannot serve metrics on {settings.metrics.host}:{settings.metrics.port}:[/] {exc.strerror or exc}"
        )
        raise typer.Exit(1) from None

    def starting(kind: str) -> None:
        err.print(f"starting the {kind} worker…", highlight=False)

    process = assemble(settings, names, on_starting=starting)

    async def start_all() -> None:
        await process.start()
        for kind, component in zip(names, process.components, strict=True):
            monitor.watch(kind, component)
        settle_after_start()  # a process of its own: the collector's settings are ours
        if on_ready is None:
            return
        # The indexing worker prepares its index in the background (a first
        # run builds it): "ready" only once search answers too.
        preparing = [c.ready for c in process.components if isinstance(getattr(c, "ready", None), asyncio.Event)]
        if not all(event.is_set() for event in preparing):
            err.print("preparing the search index…", highlight=False)
            await asyncio.gather(*(event.wait() for event in preparing))
        await on_ready()

    # Starting can take long on a busy machine (migrations, loading the
    # model): a signal meanwhile cancels it instead of waiting for it.
    starting_task = asyncio.create_task(start_all(), name="start workers")
    stopping = asyncio.create_task(stop.wait(), name="wait for a signal")
    try:
        await asyncio.wait({starting_task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting_task.done():
            try:
                starting_task.result()  # a start that failed raises here
            except nats_failures() as exc:
                err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
                raise typer.Exit(1) from None
            await stopping
        err.print("stopping: finishing the batch in hand, then closing…")
    finally:
        for task in (starting_task, stopping):
            task.cancel()
        await asyncio.gather(starting_task, stopping, return_exceptions=True)
        await monitor.drain()  # /readyz: stopping; /healthz still answers while the workers stop
        try:
            # Bounded whatever a worker is doing: what is not acked by then is
            # redelivered (to a replica, or after the restart).
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await process.stop()  # every component, even one whose start was cut short
        except TimeoutError:
            err.print(
                f"[yellow]workers did not stop within {STOP_TIMEOUT_S:.0f}s; exiting (unacked work is redelivered)[/]"
            )
        except Exception:
            logging.getLogger("memq").exception("stopping the workers failed")
        await monitor.stop()


def _preflight(settings: Settings, kinds: list[str], *, embedded_nats: bool) -> None:
    """Stop here, one line per problem and exit 1, if a port is taken, the
    data dir unusable or a package missing: before any server or worker starts."""
    from memq.workers.cli.preflight import problems

    found = problems(settings, kinds, embedded_nats=embedded_nats)
    for problem in found:
        err.print(f"[red]{escape(problem)}[/]", soft_wrap=True, highlight=False)
    if found:
        raise typer.Exit(1)


PORT_RANGE = "0-65535; 0: any free port"


@app.command()
def up(
    nats_port: int | None = typer.Option(
        None,
        help=f"Port of the embedded nats-server ({PORT_RANGE}). Default: nats.port (4222). A taken port is an error.",
        show_default=False,
    ),
    http_port: int | None = typer.Option(
        None,
        help=f"Port of the HTTP gateway ({PORT_RANGE}). Default: http.port (8480). A taken port is an error.",
        show_default=False,
    ),
) -> None:
    """Run the whole stack in one process: embedded NATS, SQLite and every worker.

    Everything it needs is checked first (ports, data dir, packages): a
    problem stops it with one line before anything starts.
    """
    from memq.workers.cli.datadir import describe_backlog, describe_data, is_fresh
    from memq.workers.runtime.embedded_nats import EmbeddedError, EmbeddedNats

    # The options go through the settings, which check the ports' range.
    overrides: dict[str, Any] = {}
    if nats_port is not None:
        overrides["nats"] = {"port": nats_port}
    if http_port is not None:
        overrides["http"] = {"port": http_port}
    # An option given names itself in the error, not the variable it stands for.
    flags = {f"{group}.port": f"--{group}-port" for group in overrides}
    settings = _settings(flags, **overrides)
    # The fact worker only with an endpoint to ask (facts.llm): off, it would only say so.
    kinds = [k for k in WorkerKind if k.value != "facts" or settings.facts.llm is not None]
    fresh = is_fresh(settings.data_dir)  # before anything is written there
    _preflight(settings, [k.value for k in kinds], embedded_nats=not settings.nats.url)
    embedded = None
    if not settings.nats.url:
        embedded = EmbeddedNats(settings, port=settings.nats.port)
        try:
            url = embedded.start()
        except EmbeddedError as exc:
            err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
            raise typer.Exit(1) from None
        if embedded.stale_files_removed:
            err.print(f"removed the run files a crashed `memq up` left in {settings.run_dir}", soft_wrap=True)
    else:
        url = _masked_nats_url(settings.nats.url)
    err.print(
        f"starting memq: NATS {url}{' (embedded)' if embedded else ''}, database {_database_shown(settings)}, "
        f"data {settings.data_dir}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )

    async def ready() -> None:
        from memq.workers.cli.demo import memq_command  # not before the checks: it imports the client and SQLAlchemy

        # the gateway writes its URL once bound (port 0 picks any free one)
        http_url = settings.run_dir / "http.url"
        http = f", HTTP {http_url.read_text().strip()}" if http_url.is_file() else ""
        data = await describe_data(settings, fresh)
        backlog = await describe_backlog(settings)
        backlog = f", backlog: {backlog}" if backlog else ""
        console.print(
            f"memq ready: NATS {url}{http}, data {data}, workers {', '.join(k.value for k in kinds)}{backlog}"
            f" — try `{memq_command()} demo` in another terminal; Ctrl-C stops cleanly.",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )

    try:
        _run_until_signal(lambda stop: _run_workers(settings, kinds, stop, on_ready=ready))
    finally:
        if embedded:
            embedded.stop()
    console.print("memq stopped; every acked event is in SQL, the rest waits in the stream.")


@app.command()
def worker(kind: WorkerKind = typer.Argument(..., help="Worker kind to run.")) -> None:
    """Run one worker kind alone (production). Several processes are replicas."""
    from memq.workers.runtime import bus
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
    _preflight(settings, [kind.value], embedded_nats=False)

    async def ready() -> None:  # what an operator (or a test restarting a replica) waits for
        err.print(f"memq worker {kind.value} ready (pid {os.getpid()})", markup=False, highlight=False)

    _run_until_signal(lambda stop: _run_workers(settings, [kind], stop, on_ready=ready))


@app.command()
def init() -> None:
    """Create or update the streams and migrate the database (idempotent)."""
    from memq.workers.runtime import bus
    from memq.workers.sql.engine import create_engine, current_revision, migrate

    settings = _settings()

    async def streams(nc: NATS) -> dict[str, str]:
        return await bus.ensure_streams(nc.jetstream(), settings.streams)

    # Patient: a cluster that is still forming is waited for, a wrong user is not.
    for name, outcome in _with_nats(streams, name="init", patient=True).items():
        console.print(f"stream {name}: {outcome}")

    async def database() -> None:
        engine = create_engine(settings.database_url())
        try:
            await migrate(engine)
            console.print(f"database: at revision {await current_revision(engine)}")
        finally:
            await engine.dispose()

    asyncio.run(database())


@app.command()
def demo(events: int = typer.Option(100, "--events", "-n", min=1, help="Events to publish.")) -> None:
    """Publish a sample conversation, read it back from SQL, check it (exit 1 if wrong)."""
    from memq.workers.cli.demo import run_demo

    settings = _settings()
    # Its errors (NATS gone for good, a publish never acknowledged) are the
    # app's one line each: memq.workers.cli.common.failure_line.
    result = asyncio.run(run_demo(settings, events, console))
    raise typer.Exit(0 if result.ok else 1)


@app.command("config")
def show_config() -> None:
    """Print the effective settings (secrets masked).

    nats.url and database.url are the ones in use: the configured URL, else
    the embedded server of a running `memq up` (or "not running: …"), and
    the SQLite file in the data dir.
    """
    from memq.workers.runtime.embedded_nats import NatsNotFound, nats_url  # not bus: no nats-py for this

    settings = _settings()
    shown = settings.public_dict()
    try:
        shown["nats"]["url"] = _masked_nats_url(nats_url(settings))
    except NatsNotFound as exc:
        stale = (settings.run_dir / "nats.url").is_file()
        shown["nats"]["url"] = str(exc) if stale else "not running: set MEMQ_NATS__URL, or start `memq up`"
    shown["database"]["url"] = _database_shown(settings)
    console.print_json(json.dumps(shown))
