"""`memq facts`: what the fact worker knows about a user (list, search, profile, history)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from memq.contracts.vocabulary import SearchMode
from memq.workers.cli.common import JsonOpt, _when, _with_client, app, console, err
from memq.workers.cli.fields import argument, option
from memq.workers.cli.reads import DEFAULT_APP, AppOpt, UserOpt

if TYPE_CHECKING:
    from memq.contracts.queries import FactsView, FactView

facts_app = typer.Typer(no_args_is_help=True, help="Facts about a user, derived from their turns by the fact worker.")
app.add_typer(facts_app, name="facts")

IncludeInvalid = Annotated[bool, typer.Option("--all", help="Also the facts a later one contradicted.")]
MinSeq = Annotated[
    int | None,
    typer.Option("--min-seq", min=1, help="Wait (at most the client's wait) until facts are derived up to it."),
]


def _behind(generation: str | None, behind: int) -> None:
    if generation is None:
        err.print("[yellow]no facts yet:[/] no fact worker has derived any (is facts.llm set on the workers?)")
    elif behind:
        err.print(f"[yellow]note:[/] {behind} session(s) of this user hold turns not derived into facts yet")


def _facts_table(title: str, facts: list[FactView], scored: bool) -> Table:
    table = Table(title=title)
    for column in ("score", "since", "until", "fact", "entities", "sources", "id"):
        if column != "score" or scored:
            table.add_column(column, justify="right" if column == "score" else "left", overflow="fold")
    for f in facts:
        sources = ", ".join(f"{s.session}#{s.seq}" for s in f.sources)
        until = _when(f.invalid_from) if f.invalid_from is not None else ""
        row: list[str | Text] = [_when(f.valid_from), until, Text(f.statement)]
        row += [Text(", ".join(f.entities)), Text(sources), f.id[:12]]
        table.add_row(*([f"{f.score or 0:.3f}"] if scored else []), *row)
    return table


def _show(view: FactsView, title: str, scored: bool, as_json: bool) -> None:
    if as_json:
        console.print_json(view.model_dump_json())
        return
    _behind(view.generation, view.behind)
    console.print(_facts_table(title, view.facts, scored))


@facts_app.command("list")
def facts_list(
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    include_invalid: IncludeInvalid = False,
    limit: Annotated[int, option("facts", "limit", "--limit", "-n", help="Facts.")] = 20,
    min_seq: MinSeq = None,
    as_json: JsonOpt = False,
) -> None:
    """The user's facts, oldest first."""
    view = _with_client(app_id, lambda c: c.facts(user, include_invalid=include_invalid, limit=limit, min_seq=min_seq))
    _show(view, f"facts about {user}", False, as_json)


@facts_app.command("search")
def facts_search(
    query: Annotated[str, argument("facts", "query", help="What to look for.")],
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    include_invalid: IncludeInvalid = False,
    limit: Annotated[int, option("facts", "limit", "--limit", "-n", help="Facts.")] = 10,
    mode: Annotated[SearchMode, typer.Option(help="keyword (BM25), vector, or hybrid.")] = "hybrid",
    min_seq: MinSeq = None,
    as_json: JsonOpt = False,
) -> None:
    """The user's facts that relate to the query, best first (ranked as a search)."""
    view = _with_client(
        app_id,
        lambda c: c.facts(user, query, mode=mode, include_invalid=include_invalid, limit=limit, min_seq=min_seq),
    )
    if view.note and not as_json:
        err.print(f"[yellow]note:[/] {view.note}")
    _show(view, f"facts about {user} for {query!r}", True, as_json)


@facts_app.command("profile")
def facts_profile(
    user: UserOpt, app_id: AppOpt = DEFAULT_APP, min_seq: MinSeq = None, as_json: JsonOpt = False
) -> None:
    """The user's current facts, grouped by the entities they name."""
    view = _with_client(app_id, lambda c: c.profile(user, min_seq=min_seq))
    if as_json:
        console.print_json(view.model_dump_json())
        return
    _behind(view.generation, view.behind)
    table = Table(title=f"what is known about {user}")
    for column in ("entity", "facts"):
        table.add_column(column, overflow="fold")
    for group in view.entities:
        table.add_row(Text(group.entity or "(none)"), Text("\n".join(f.statement for f in group.facts)))
    console.print(table)


@facts_app.command("history")
def facts_history(
    fact_id: Annotated[str, argument("facts.history", "fact_id", help="The fact's id (`memq facts list --json`).")],
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    as_json: JsonOpt = False,
) -> None:
    """Every revision of one fact, oldest first: nothing is overwritten in place."""
    view = _with_client(app_id, lambda c: c.fact_history(user, fact_id))
    if as_json:
        console.print_json(view.model_dump_json())
        return
    table = Table(title=f"fact {fact_id}")
    for column in ("written", "change", "fact", "until", "sources"):
        table.add_column(column, overflow="fold")
    for r in view.revisions:
        f = r.fact
        until = _when(f.invalid_from) if f.invalid_from is not None else ""
        sources = ", ".join(f"{s.session}#{s.seq}" for s in f.sources)
        table.add_row(_when(r.written_at), r.kind, Text(f.statement), until, Text(sources))
    console.print(table)
