"""What every `memq` command shares: the typer app, the consoles, settings
and logging, and running a command's work on a NATS connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from memq.contracts.errors import MemqError

# `memq --help` imports every command's module: what a command needs beyond
# typer and rich (nats-py, pydantic-settings, SQLAlchemy, the ML stack) is
# imported when it runs (tests/unit/test_cli_startup.py holds them to it).
if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from pydantic import ValidationError

    from memq.contracts.client import MemoryClient
    from memq.workers.settings import Settings

# No locals in tracebacks: they would print settings, URLs and passwords.
# Plain help (click's): typer's rich help imports rich's Markdown, syntax and
# traceback modules, a third of `memq --help`'s time, and the plain text
# reads the same in a pipe and at any width.


class _App(typer.Typer):
    """The typer app, whose errors of memq's own end in one line and exit 1
    (:func:`failure_line`), whichever command raised them: a publish whose
    outcome is unknown once ended `memq demo` in a 150-line traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            line = failure_line(exc)
            if line is None:  # a bug: its traceback is what to report
                raise
            err.print(line, soft_wrap=True, highlight=False)
            sys.exit(1)


app = _App(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
    help="memq: session and memory layer for LLM agents.",
)
console = Console()
err = Console(stderr=True)
# Every read command's --json: what it shows, as the reply's JSON.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        console.print(f"memq {version('memq')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print memq's version and exit."),
    ] = False,
) -> None:
    """memq: session and memory layer for LLM agents."""


def print_table(table: Any) -> None:
    """``table`` at a terminal as wide as the terminal; in a pipe (a file, a
    `grep`) as wide as its content, so that no cell is cut at the 80 columns
    rich assumes there."""
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    # print(width=) is capped at the console's width: a console of the table's own
    width = max(Measurement.get(console, console.options.update(width=10_000), table).maximum, console.width)
    Console(file=console.file, width=width, color_system=None, no_color=True, force_terminal=False).print(table)


def log_handler() -> logging.Handler:
    """Rich lines, but plain tracebacks: a rich traceback syntax-highlights
    the whole source file of every frame, 3-4 s for one SQLAlchemy error on
    a busy 2-core machine, with the worker's event loop blocked meanwhile
    (a PostgreSQL outage of 4 s kept commits stopped for 15 s)."""
    from rich.logging import RichHandler

    return RichHandler(console=err, show_path=False, rich_tracebacks=False)


def _setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level,
        format="%(name)s: %(message)s",
        handlers=[log_handler()],
        force=True,
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)


_warned_env = False


def _warn_unknown_env() -> None:
    """One line per ``MEMQ_*`` variable that sets nothing: pydantic-settings
    ignores them, and a typo would otherwise look like a setting that has no
    effect. Once per process: a command that loads its settings twice (`memq
    status`: its own, then its NATS connection's) warns once."""
    global _warned_env
    if _warned_env:
        return
    _warned_env = True
    from memq.workers.settings import setting_groups, unknown_env

    for var, close in unknown_env(os.environ):
        if close:
            hint = f"; did you mean {close}?"
        else:
            groups = ", ".join(g.upper() for g in setting_groups())
            hint = (
                f": no such setting (settings are MEMQ_<GROUP>__<NAME>, the groups {groups}; "
                "`memq config` lists them all)"
            )
        err.print(f"[yellow]warning:[/] {var} is not a memq setting, ignored{hint}", soft_wrap=True, highlight=False)


def settings_errors(exc: ValidationError, flags: dict[str, str] | None = None) -> str:
    """A settings error on one line: each field with its variable (or the
    command's option that set it, from ``flags``: dotted field -> option)
    and what is wrong. Never the value given: it may be a password or a URL
    with one."""
    flags = flags or {}

    def source(loc: tuple) -> str:
        dotted = ".".join(map(str, loc))
        return flags.get(dotted) or f"MEMQ_{'__'.join(map(str, loc)).upper()}"

    return "; ".join(f"{'.'.join(map(str, e['loc']))} ({source(e['loc'])}): {e['msg']}" for e in exc.errors())


def _settings(flags: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """The settings of this command (``overrides``: its options; ``flags``:
    the option of each, by dotted field, for errors to name), its logging
    set up; unknown ``MEMQ_*`` variables warned about."""
    from pydantic import ValidationError

    from memq.workers.settings import load_settings

    _warn_unknown_env()
    try:
        settings = load_settings(**overrides)
    except ValidationError as exc:  # one line, no traceback
        err.print(f"[red]invalid settings:[/] {escape(settings_errors(exc, flags))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # e.g. a config file that is no TOML
        err.print(f"[red]invalid settings:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    _setup_logging(settings)
    return settings


def failure_line(exc: BaseException) -> str | None:
    """The one line (rich markup) a command prints for an error memq raises
    on purpose: every :class:`~memq.contracts.errors.MemqError` (its code and
    message), NATS that cannot be found, reached or used, the embedded
    server's start; None for anything else (a bug, shown with its traceback).
    tests/unit/test_cli_errors.py holds every memq error class to it."""
    from memq.workers.runtime import bus
    from memq.workers.runtime.embedded_nats import EmbeddedError  # imported at an error only: the cost is no one's

    if isinstance(exc, bus.NatsTLSError):
        return f"[red]{escape(str(exc))}[/]: check MEMQ_NATS__TLS__CA_FILE / CERT_FILE / KEY_FILE"
    if isinstance(exc, bus.NatsNotFound | bus.NatsUnreachable | EmbeddedError):  # they name the URL and what to check
        return f"[red]{escape(str(exc))}[/]"
    if isinstance(exc, MemqError):
        return f"[red]{escape(exc.code)}:[/] {escape(exc.message)}"
    if type(exc).__module__.startswith("nats."):  # nats-py's own (a closed connection, a timeout)
        return f"[red]NATS failed:[/] {escape(type(exc).__name__)}: {escape(str(exc) or 'no details')}"
    return None


def nats_failures() -> tuple[type[Exception], ...]:
    """What a command prints, as one line and no traceback, when NATS cannot be used."""
    from memq.workers.runtime import bus

    return (bus.NatsNotFound, bus.NatsUnreachable, bus.NatsTLSError)


def _masked_nats_url(url: str) -> str:
    from memq.workers.settings import mask_url

    return ",".join(mask_url(u.strip()) for u in url.split(","))


def _database_shown(settings: Settings) -> str:
    """The database URL the workers use, password masked."""
    from memq.workers.settings import mask_url

    configured = settings.database.url.get_secret_value() if settings.database.url is not None else None
    if configured == "inmemory":
        return "inmemory (SQLite in memory, lost on restart)"
    return mask_url(settings.database_url())


T = TypeVar("T")
PROBE_TIMEOUT_S = 2.0


# What an operator's command needs, said when NATS refuses the user it runs as.
ADMIN_CREDENTIALS = (
    "operators' commands run as memq's admin user (or the workers user), not an app's: set "
    "MEMQ_NATS__USER and MEMQ_NATS__PASSWORD, or MEMQ_NATS__CREDS_FILE (the users of `memq nats accounts`)"
)


class Refused(Exception):
    """NATS refused the command's user a subject it needs (a permissions violation)."""


def _violation(exc: Exception) -> str | None:
    """The server's permissions violation in an ``error_cb`` error, if it is one."""
    text = str(exc)
    return text.removeprefix("nats: ") if "permissions violation" in text.lower() else None


async def _guarded(work: Awaitable[T], denied: asyncio.Future) -> T:
    """``work``, given up as soon as NATS reports a permissions violation.

    nats-py reports a violation only to ``error_cb`` (``MemoryClient._denied``
    reads it the same way) and lets the request wait out its timeout, or
    JetStream setup retry "unavailable" for its whole patience: a command
    with the wrong user would time out with a traceback or retry forever.
    """
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, denied}, return_when=asyncio.FIRST_COMPLETED)
    if task.done() and (task.cancelled() or task.exception() is None or not denied.done()):
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise Refused(denied.result())


def _with_nats(
    work: Callable[[NATS], Awaitable[T]],
    *,
    admin: bool = True,
    optional: tuple[str, ...] = (),
    name: str = "cli",
    patient: bool = False,
) -> T:
    """Run ``work`` on a fresh NATS connection; print a clear error and exit 1 on failure.

    :param admin: an operator's command: a permissions violation fails it at
        once with one line, "forbidden", and the credentials it needs; it
        first asks JetStream for the account's info, so a wrong user is
        refused before any slow work starts.
    :param optional: subject prefixes the command can do without (a
        violation on them is not fatal).
    :param patient: connect as a worker does (ride out a NATS restart)
        rather than give up after two tries.
    """
    from memq.workers.runtime import bus

    settings = _settings()

    async def main() -> T:
        denied: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_error(exc: Exception) -> None:  # the command's own error says the rest
            found = _violation(exc)
            if found and not denied.done() and not any(f'to "{p.lower()}' in found.lower() for p in optional):
                denied.set_result(found)

        options = bus.connect_options(settings, name)
        if not patient:
            # A command should fail fast, not ride out an outage like a worker:
            # the first connect gives up after two tries 0.2 s apart.
            options = {**options, "max_reconnect_attempts": 1, "reconnect_time_wait": 0.2}
        nc = await bus.open_connection({**options, "error_cb": on_error})
        try:
            if not admin:
                return await work(nc)

            async def probed() -> T:
                with contextlib.suppress(Exception):  # only its refusal matters here
                    await nc.jetstream(timeout=PROBE_TIMEOUT_S).account_info()
                return await work(nc)

            return await _guarded(probed(), denied)
        finally:
            await nc.close()

    try:
        return asyncio.run(main())
    except Refused as exc:
        user = settings.nats.user or ("the creds file's user" if settings.nats.creds_file else "this user")
        err.print(
            f"[red]forbidden:[/] NATS refused {escape(user)} ({escape(str(exc))}): {ADMIN_CREDENTIALS}",
            soft_wrap=True,
        )
    except Exception as exc:
        if (line := failure_line(exc)) is None:
            raise
        err.print(line, soft_wrap=True, highlight=False)
    raise typer.Exit(1)


def _with_client(app_id: str, work: Callable[[MemoryClient], Awaitable[T]]) -> T:
    from memq.contracts.client import MemoryClient

    # Not an operator's command: the client says itself when NATS refuses the app.
    return _with_nats(lambda nc: work(MemoryClient(nc, app_id, consistency="any")), admin=False)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
