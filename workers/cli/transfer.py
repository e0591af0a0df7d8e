"""Backups and moves between deployments: `memq export` and `memq import`
(the format: :mod:`memq.workers.transfer.format`)."""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, BinaryIO

import typer
from rich.markup import escape

from memq.contracts.errors import InvalidId
from memq.workers.cli.common import _settings, _with_nats, app, err

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS


@contextmanager
def _progress(description: str, total: int | None):
    """A progress bar on stderr (shown when stderr is a terminal); yields the
    callback that counts one record."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8.0f} records/s"),
        TimeRemainingColumn(),
    )
    started = time.monotonic()
    with Progress(*columns, console=err, disable=not err.is_terminal) as bar:
        task = bar.add_task(description, total=total, rate=0.0)
        done = 0

        def advance() -> None:
            nonlocal done
            done += 1
            if done % 64 == 0 or done == total:  # redrawing per record would cost more than the record
                elapsed = time.monotonic() - started
                bar.update(task, completed=done, rate=done / elapsed if elapsed > 0 else 0.0)

        yield advance
        bar.update(task, completed=done)


@app.command("export")
def export_command(
    app_id: Annotated[str | None, typer.Option("--app", "-a", help="Only this app.")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user (needs --app).")] = None,
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Only this session (needs --app and --user).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of standard output.")
    ] = None,
) -> None:
    """Export sessions, events, state, checkpoints and artifact references as JSON Lines.

    Reads SQL (the source of truth) page by page in one snapshot; `memq import`
    replays the file into another deployment. A --session that does not exist
    is an error (exit 1), and --out is then not touched.
    """
    from memq.workers.sql.engine import create_engine
    from memq.workers.transfer.export import Scope, count_records, export_lines, missing

    try:
        scope = Scope(app_id, user, session)
    except (InvalidId, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    settings = _settings()

    async def absent() -> str | None:
        engine = create_engine(settings.database_url())
        try:
            return await missing(engine, scope)
        finally:
            await engine.dispose()

    # Checked before --out is opened: a typo must not truncate an earlier export.
    try:
        why = asyncio.run(absent())
    except Exception as exc:  # the database: one line, no traceback with the URL
        err.print(f"[red]export failed: {type(exc).__name__}: {escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    if why is not None:
        err.print(f"[red]{escape(why)}:[/] nothing exported", soft_wrap=True)
        raise typer.Exit(1)
    if out is None and sys.stdout.isatty():
        err.print("[yellow]writing the export to the terminal; redirect it (> file.jsonl) or use --out[/]")

    async def main(sink: BinaryIO) -> int:
        engine = create_engine(settings.database_url())
        written = 0
        try:
            total = await count_records(engine, scope)
            with _progress("exporting", total) as advance:
                async for line in export_lines(engine, scope, on_record=advance):
                    sink.write(line)
                    written += 1
        finally:
            await engine.dispose()
        return written - 2  # header and footer

    try:
        if out is None:
            records = asyncio.run(main(sys.stdout.buffer))
            sys.stdout.buffer.flush()
        else:
            with out.open("wb") as f:
                records = asyncio.run(main(f))
    except OSError as exc:
        err.print(f"[red]cannot write the export: {escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    except Exception as exc:  # the database: one line, no traceback with the URL
        err.print(f"[red]export failed: {type(exc).__name__}: {escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    err.print(f"exported {records} records" + (f" to {escape(str(out))}" if out else ""))


@app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="A file written by `memq export`.", exists=True, dir_okay=False)],
) -> None:
    """Import a `memq export` file through the event stream, skipping what is already there.

    Every line is checked first: a bad line is reported with its number and
    reason, and then nothing is imported. Importing the same file twice
    changes nothing.
    """
    from memq.workers.runtime.event_streams import stream_of
    from memq.workers.sql.engine import create_engine
    from memq.workers.transfer.importer import Importer, ImportFailed, check_file

    settings = _settings()
    checked = check_file(file)
    if checked.errors:
        for error in checked.errors:
            err.print(f"[red]{escape(str(file))}:{error.lineno}:[/] {escape(error.reason)}", soft_wrap=True)
        more = checked.error_count - len(checked.errors)
        err.print(
            f"[red]{checked.error_count} bad line(s){f' ({more} not shown)' if more else ''}; nothing was imported[/]"
        )
        raise typer.Exit(1)

    async def work(nc: NATS):
        engine = create_engine(settings.database_url())
        try:
            with _progress("importing", checked.records) as advance:
                importer = Importer(
                    nc,
                    engine,
                    stream_of=lambda app: stream_of(settings.streams, app),
                    durable=settings.persistence.durable,
                    on_record=advance,
                )
                return await importer.run(file)
        finally:
            await engine.dispose()

    try:
        stats = _with_nats(work)
    except ImportFailed as exc:
        err.print(f"[red]import stopped at {escape(str(file))}:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    err.print(
        f"imported {stats.records} records: {stats.published} published "
        f"({stats.sessions_created} new sessions), {stats.present} already there"
    )
