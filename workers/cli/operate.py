"""Operating memq: rebuild the index, show status, inspect and replay dead letters."""

from __future__ import annotations

import json
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from memq.contracts.errors import InvalidId
from memq.workers.cli.common import JsonOpt, _settings, _short, _with_nats, app, console, err

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

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
    restart: Annotated[
        bool, typer.Option("--restart", help="Drop an unfinished rebuild and start over instead of resuming it.")
    ] = False,
    pull: Annotated[
        bool,
        typer.Option(
            "--pull/--no-pull",
            help="Embed here too, as one more replica beside the indexing workers (default); "
            "--no-pull leaves the replay to the workers.",
        ),
    ] = True,
) -> None:
    """Rebuild the index into a fresh generation while the live one serves, then switch.

    Every indexing worker takes a share of the replay; an unfinished rebuild is resumed."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from memq.workers.index.backends import open_backend
    from memq.workers.index.embedders import open_embedder
    from memq.workers.indexing.indexer import make_indexer
    from memq.workers.indexing.rebuild import rebuild, scope_filter
    from memq.workers.sql.engine import create_engine

    try:
        scope_filter(app_id, user)  # --user needs --app; an id no event can have
    except (InvalidId, ValueError) as exc:
        err.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    settings = _settings()

    async def work(nc: NATS):
        backend = open_backend(settings)
        await backend.open()
        embedder = await open_embedder(settings.indexing)
        engine = create_engine(settings.database_url())  # the SQL source, and each turn's previous one
        indexer = make_indexer(settings, backend, embedder, nc.jetstream(), engine=engine)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[seqs]}"),
            TimeRemainingColumn(),
        )
        try:
            with Progress(*columns, console=err) as bar:
                task = bar.add_task(f"rebuilding ({embedder.model})", total=None, seqs="")

                def progress(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total, seqs=f"{done} of {total}")

                return await rebuild(
                    settings,
                    nc,
                    indexer,
                    source=source.value,
                    app=app_id,
                    user=user,
                    engine=engine if source is RebuildSource.sql else None,
                    progress=progress,
                    restart=restart,
                    work=pull,
                    notice=lambda text: bar.console.print(escape(text)),
                )
        finally:
            await backend.close()
            await embedder.close()
            await engine.dispose()

    try:
        result = _with_nats(work)
    except ValueError as exc:
        err.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    console.print(
        f"index {result.generation} is live: {result.docs} docs from {result.replayed} messages"
        + (f" (+{result.copied} copied)" if result.copied else "")
        + f", {result.model}, in {result.seconds:.1f}s"
        + (" (resumed)" if result.resumed else "")
    )
    for share in result.shares:
        console.print(f"  {escape(share.replica)}: {share.docs} docs from {share.messages} messages")


@index_app.command("generations")
def index_generations(
    as_json: JsonOpt = False,
) -> None:
    """List the index's generations: live, rebuilding (resumed by the next rebuild) or abandoned."""
    from dataclasses import asdict

    from rich.table import Table

    from memq.workers.index.backends import open_backend
    from memq.workers.indexing.generations import list_generations

    settings = _settings()

    async def work(nc: NATS):
        backend = open_backend(settings)
        await backend.open()
        try:
            return await list_generations(backend, nc.jetstream(), settings)
        finally:
            await backend.close()

    rows = _with_nats(work)
    if as_json:
        console.print_json(json.dumps([asdict(r) for r in rows]))
        return
    table = Table(title="index generations")
    for column in ("generation", "state", "docs", "model", "dim", "floor", "note"):
        table.add_column(column, justify="right" if column in ("docs", "dim", "floor") else "left")
    for r in rows:
        floor = "" if r.min_similarity is None else f"{r.min_similarity:.2f}"
        table.add_row(r.generation, r.state, str(r.docs), escape(r.model), str(r.dim), floor, escape(r.note))
    if not rows:
        table.caption = "no index yet: `memq index rebuild` builds one"
    console.print(table)


@index_app.command("drop")
def index_drop(
    generations: Annotated[
        list[str] | None, typer.Argument(help="Generations to drop (see `memq index generations`).")
    ] = None,
    all_: Annotated[bool, typer.Option("--all-unused", help="Drop every generation that is not live.")] = False,
) -> None:
    """Drop generations that are not live: abandoned ones, or an unfinished rebuild's (which ends it)."""
    from memq.workers.index.backends import open_backend
    from memq.workers.indexing.generations import drop_generations

    if not generations and not all_:
        err.print("[red]name the generations to drop[/] (`memq index drop g5`), or pass --all-unused")
        raise typer.Exit(2)
    settings = _settings()

    async def work(nc: NATS):
        backend = open_backend(settings)
        await backend.open()
        try:
            return await drop_generations(backend, nc.jetstream(), settings, None if all_ else generations)
        finally:
            await backend.close()

    try:
        dropped = _with_nats(work)
    except ValueError as exc:
        err.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    console.print(f"dropped {', '.join(dropped)}" if dropped else "no generation to drop")


@app.command()
def status(
    as_json: JsonOpt = False,
) -> None:
    """Show consumer lag per worker kind, live worker instances and dead letters."""
    from memq.workers.status import collect_status, render

    settings = _settings()
    # $SRV pings are the workers user's to answer, not to send: it still sees the consumers.
    report = _with_nats(lambda nc: collect_status(nc, settings.streams), optional=("$SRV.",))
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        render(report, console)


dlq_app = typer.Typer(no_args_is_help=True, help="Inspect dead letters and send them back once fixed.")
app.add_typer(dlq_app, name="dlq")


def _dlq_filter(worker: str | None, code: str | None, seqs: list[int] | None):
    from memq.workers.runtime.dead_letters import DeadLetterFilter

    return DeadLetterFilter(worker=worker, code=code, seqs=frozenset(seqs) if seqs else None)


@dlq_app.command("list")
def dlq_list(
    worker: Annotated[str | None, typer.Option("--worker", "-w", help="Only this worker's dead letters.")] = None,
    code: Annotated[str | None, typer.Option("--code", "-c", help="Only this error code, e.g. oversize.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most this many.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List dead letters, oldest first, with why each was given up on."""
    from rich.table import Table

    from memq.workers.runtime.dead_letters import list_dead_letters, summarize

    settings = _settings()
    where = _dlq_filter(worker, code, None)
    letters = _with_nats(lambda nc: list_dead_letters(nc.jetstream(), settings.streams.dlq, where, limit))
    if as_json:
        console.print_json(json.dumps([letter.to_dict() for letter in letters]))
        return
    table = Table(
        title=f"dead letters in {settings.streams.dlq}" + (f" (first {limit})" if len(letters) == limit else "")
    )
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
    seqs: Annotated[
        list[int] | None, typer.Argument(help="DLQ sequence numbers to replay (see `memq dlq list`).")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Replay every dead letter that matches the filters.")] = False,
    worker: Annotated[str | None, typer.Option("--worker", "-w", help="Only this worker's dead letters.")] = None,
    code: Annotated[str | None, typer.Option("--code", "-c", help="Only this error code.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Leave the dead letters in the DLQ after replaying.")] = False,
) -> None:
    """Publish dead letters again on their original subjects, then delete them.

    Fix the cause first (a setting, a worker bug, the database): a message
    that fails again is dead-lettered again, with its new reason.
    """
    from memq.workers.runtime.dead_letters import replay_dead_letters

    if not seqs and not all_:
        err.print(
            "[red]name the dead letters to replay[/] (`memq dlq replay 3 7`), or pass --all (with --worker/--code filters)"
        )
        raise typer.Exit(2)
    settings = _settings()
    where = _dlq_filter(worker, code, seqs)

    def replayed(letter) -> None:
        console.print(f"replayed dead letter {letter.seq} ({letter.code}) onto {escape(letter.original_subject)}")

    result = _with_nats(
        lambda nc: replay_dead_letters(
            nc.jetstream(), settings.streams.dlq, settings.streams, where, keep=keep, on_replayed=replayed
        )
    )
    for seq in result.squatted:
        err.print(
            f"[yellow]dead letter {seq}:[/] its replay id was taken by another message (see "
            "memq_squatted_ids_total); sent again under a fresh id"
        )
    for seq, why in result.skipped:
        err.print(f"[yellow]skipped dead letter {seq}:[/] {escape(why)}")
    missing = sorted(set(seqs or ()) - set(result.replayed) - {seq for seq, _ in result.skipped})
    if missing:
        filtered = " (or filtered out by --worker/--code)" if worker or code else ""
        err.print(
            f"[red]no dead letter {', '.join(map(str, missing))} in {escape(settings.streams.dlq)}{filtered}:[/] "
            "see `memq dlq list`",
            soft_wrap=True,
        )
    # The count only when something happened: "0 replayed, deleted" after an
    # error read as if the command had done its work.
    if result.replayed:
        console.print(f"{len(result.replayed)} replayed" + ("" if keep else ", deleted from the DLQ"))
    elif not (result.skipped or missing):
        console.print("no dead letter matches: nothing replayed")
    if result.skipped or missing:
        raise typer.Exit(1)
