"""The `memq` command: a thin layer over the library (typer + rich)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from enum import Enum

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.panel import Panel

from workers import bus
from workers.settings import Settings, load_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="memq: session and memory layer for LLM agents.")
console = Console()
err = Console(stderr=True)


class WorkerKind(str, Enum):
    persistence = "persistence"


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


async def _run_workers(settings: Settings, kinds: list[WorkerKind], stop: asyncio.Event) -> None:
    from workers.persistence.worker import PersistenceWorker

    factories = {WorkerKind.persistence: PersistenceWorker}
    workers = [factories[k](settings) for k in kinds]
    started = []
    try:
        for w in workers:
            await w.start()
            started.append(w)
        await stop.wait()
        err.print("stopping: finishing the batch in hand, then closing…")
    finally:
        for w in reversed(started):
            await w.stop()


@app.command()
def up(
    nats_port: int = typer.Option(4222, help="Port of the embedded nats-server (0, or taken: a free one)."),
) -> None:
    """Run the whole stack in one process: embedded NATS, SQLite and every worker."""
    from workers.embedded import EmbeddedError, EmbeddedNats

    settings = _settings()
    embedded = None
    if not settings.nats.url:
        embedded = EmbeddedNats(settings, port=nats_port)
        try:
            url = embedded.start()
        except EmbeddedError as exc:
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(1) from None
    else:
        url = settings.nats.url
    public = settings.public_dict()
    console.print(
        Panel.fit(
            f"NATS       {url}{' (embedded)' if embedded else ''}\n"
            f"database   {public['database']['url'] or settings.database_url()}\n"
            f"data dir   {settings.data_dir}\n"
            f"workers    {', '.join(k.value for k in WorkerKind)}\n\n"
            "Try `memq demo` in another terminal. Ctrl-C stops cleanly.",
            title="memq up",
        )
    )
    try:
        _run_until_signal(lambda stop: _run_workers(settings, list(WorkerKind), stop))
    finally:
        if embedded:
            embedded.stop()
    console.print("memq stopped; every acked event is in SQL, the rest waits in the stream.")


@app.command()
def worker(kind: WorkerKind = typer.Argument(..., help="Worker kind to run.")) -> None:
    """Run one worker kind alone (production). Several processes are replicas."""
    settings = _settings()
    try:
        bus.nats_url(settings)
    except bus.NatsNotFound as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    _run_until_signal(lambda stop: _run_workers(settings, [kind], stop))


@app.command()
def init() -> None:
    """Create or update the streams and migrate the database (idempotent)."""
    from workers.sql.engine import create_engine, current_revision, migrate

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
    except bus.NatsNotFound as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None


@app.command()
def demo(events: int = typer.Option(100, "--events", "-n", min=1, help="Events to publish.")) -> None:
    """Publish a sample conversation, read it back from SQL, check it (exit 1 if wrong)."""
    from workers.demo import run_demo

    settings = _settings()
    try:
        result = asyncio.run(run_demo(settings, events, console))
    except bus.NatsNotFound as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    raise typer.Exit(0 if result.ok else 1)


@app.command("config")
def show_config() -> None:
    """Print the effective settings (secrets masked)."""
    settings = _settings()
    console.print_json(json.dumps(settings.public_dict()))


if __name__ == "__main__":
    app()
