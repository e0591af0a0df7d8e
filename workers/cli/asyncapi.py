"""`memq asyncapi`: write (or check) the AsyncAPI document of memq
(:mod:`memq.workers.cli.asyncapi_document`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memq.workers.cli.common import app, console, err


@app.command("asyncapi")
def asyncapi_command(
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Where to write it. Default: contracts/asyncapi.json.")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if the file differs from a fresh document.")
    ] = False,
) -> None:
    """Write the AsyncAPI 3.0 document: every subject memq reads or writes, with its schemas."""
    from memq.workers.cli import asyncapi_document as asyncapi  # builds the worker app: only for this command

    path = out or asyncapi.DEFAULT_PATH
    if check:
        if not asyncapi.is_current(path):
            err.print(f"[red]{path} is not the current document:[/] run `{asyncapi.COMMAND}`")
            raise typer.Exit(1)
        console.print(f"{path} is current")
        return
    console.print(f"wrote {asyncapi.write(path)}")
