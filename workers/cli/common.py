"""What every `memq` command shares: the typer app, the consoles, settings
and logging, and running a command's work on a NATS connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

import typer
from nats.aio.client import Client as NATS
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError
from memq.workers import bus
from memq.workers.settings import Settings, load_settings, mask_url

# No locals in tracebacks: they would print settings, URLs and passwords.
app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    help="memq: session and memory layer for LLM agents.",
)
console = Console()
err = Console(stderr=True)


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


# What a command prints, as one line and no traceback, when NATS cannot be used.
NATS_FAILURES = (bus.NatsNotFound, bus.NatsUnreachable, bus.NatsTLSError)


def _masked_nats_url(url: str) -> str:
    return ",".join(mask_url(u.strip()) for u in url.split(","))


def _database_shown(settings: Settings) -> str:
    """The database URL the workers use, password masked."""
    configured = settings.database.url.get_secret_value() if settings.database.url is not None else None
    if configured == "inmemory":
        return "inmemory (SQLite in memory, lost on restart)"
    return mask_url(settings.database_url())


T = TypeVar("T")


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
    return _with_nats(lambda nc: work(MemoryClient(nc, app_id, consistency="any")))


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
