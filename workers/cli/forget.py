"""`memq forget`: forget one event of a session everywhere, as `memq sessions
delete` does a whole session (MemoryClient.forget_event)."""

from __future__ import annotations

from typing import Annotated

import typer

from memq.workers.cli.common import _with_client, app, console
from memq.workers.cli.reads import DEFAULT_APP, AppOpt, SessionArg, UserOpt


@app.command()
def forget(
    session: SessionArg,
    seq: Annotated[
        int,
        typer.Argument(min=1, help="The event's stream sequence (seq in `memq sessions show --events N`)."),
    ],
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Forget one event of a session everywhere: SQL, index, cache and the stream.
    An event the session does not hold is an error (exit 1): nothing is published.
    A summary that already folded the event keeps it."""
    if not yes:
        typer.confirm(f"Forget event {seq} of session {session!r} of user {user!r} in app {app_id!r}?", abort=True)
    forgot = _with_client(app_id, lambda c: c.forget_event(user, session, seq))
    console.print(f"forget published at seq {forgot}: the workers remove the event everywhere.")
