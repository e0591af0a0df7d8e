"""Reading sessions back: a thin layer over MemoryClient (sessions, history,
context, search)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.json import JSON
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memq.contracts.errors import NotFound
from memq.contracts.vocabulary import ContextFormat, Role, SearchMode, SearchRole, StrategyName
from memq.workers.cli.common import JsonOpt, _short, _with_client, app, console, err, print_table
from memq.workers.cli.fields import argument, option

if TYPE_CHECKING:
    from memq.contracts.client import MemoryClient

DEFAULT_APP = "memq-demo"  # the app `memq demo` writes to, so the demo can be browsed without flags
AppOpt = Annotated[
    str, typer.Option("--app", "-a", envvar="MEMQ_APP", help="App id (memq-demo is the one `memq demo` writes to).")
]
UserOpt = Annotated[str, typer.Option("--user", "-u", help="User id.")]
SessionArg = Annotated[str, typer.Argument(help="Session id.")]
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


AfterOpt = Annotated[
    float | None,
    typer.Option(
        parser=parse_after, metavar="SPAN|DATETIME", help="Only events after: 24h, 30m, 7d or an ISO datetime."
    ),
]
# The same field of a session.get and a history request (_EventFilters); its
# callback holds it to the contract's Role (typer takes no list of a Literal).
RoleOpt = Annotated[
    list[str] | None, option("history", "roles", "--role", help="Only events with this role (repeatable).")
]
# Every read's --min-seq (its bounds are the same in each request: Request's).
MinSeqOpt = Annotated[
    int | None,
    option("context", "min_seq", help="Answer once this stream sequence (a write's seq) is committed."),
]

sessions_app = typer.Typer(no_args_is_help=True, help="List, show and delete sessions.")
app.add_typer(sessions_app, name="sessions")


# The choices of --strategy, --format and --mode are the contract's own
# (memq.contracts.queries), so the CLI offers what a request may say.
StrategyOpt = Annotated[
    StrategyName | None,
    typer.Option(help="Working-memory strategy (none = all). Default: the app's (summary_buffer unless configured)."),
]


# The strategy's parameters, flat (as the gateway's): StrategySpec's fields,
# the same in a history and a context request.
BudgetOpt = Annotated[
    int | None, option("context", "strategy.budget", help="Token budget. Default: the app's setting (8000).")
]
WindowOpt = Annotated[
    int | None, option("context", "strategy.window", help="buffer_window: last N messages (default 20).")
]
TurnsOpt = Annotated[int | None, option("context", "strategy.turns", help="buffer_window: last N user turns.")]
PreserveRecentOpt = Annotated[
    int | None,
    option(
        "context", "strategy.preserve_recent", help="token_window: recent messages kept whenever they fit (default 5)."
    ),
]
ThresholdOpt = Annotated[
    float | None,
    option(
        "context",
        "strategy.threshold",
        help="summary_buffer: ask for a summary past this share of the budget (default 0.85).",
    ),
]
TargetOpt = Annotated[
    float | None,
    option(
        "context",
        "strategy.target",
        help="summary_buffer: after summarizing, aim at this share of the budget (default 0.7).",
    ),
]
MinRecentOpt = Annotated[
    int | None,
    option(
        "context",
        "strategy.min_recent",
        help="summary_buffer: recent messages never folded into a summary (default 3).",
    ),
]
RecallShareOpt = Annotated[
    float | None,
    option(
        "context",
        "strategy.recall_share",
        help="summary_buffer: budget share recalled memories may take before the summary and older messages.",
    ),
]
ModelOpt = Annotated[str | None, option("context", "model", help="Count tokens as this model. Default: the app's.")]


def _strategy_spec(kind: StrategyName | None, **params: float | None) -> dict[str, Any] | None:
    """The request's strategy override from the command's options: only
    those given (None: the app's strategy as it is)."""
    spec = {"kind": kind, **params}
    return {k: v for k, v in spec.items() if v is not None} or None


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


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
    limit: Annotated[int, option("sessions.list", "limit", "--limit", "-n", help="Sessions per page.")] = 50,
    every: Annotated[bool, typer.Option("--all", help="Follow the cursors through every page.")] = False,
    min_seq: MinSeqOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List sessions, most recently updated first (one page unless --all).
    Ids are never cut: in a pipe every line is as wide as its ids; at a
    terminal the times fold first."""
    from memq.contracts.queries import SessionsPage

    async def fetch(client: MemoryClient) -> SessionsPage:
        if not every:
            return await client.list_sessions(user, limit=limit, min_seq=min_seq)
        found = []
        with err.status("fetching sessions…") as progress:
            async for info in client.iter_sessions(user, page_size=limit, min_seq=min_seq):
                found.append(info)
                if len(found) % limit == 0:
                    progress.update(f"fetching sessions… {len(found)}")
        return SessionsPage(sessions=found)

    page = _with_client(app_id, fetch)
    if as_json:
        console.print_json(page.model_dump_json())
        return
    found, more = page.sessions, page.next_cursor is not None
    table = Table(title=f"sessions of {app_id}" + (f", user {user}" if user else ""))
    # An id is what a user copies into the next command: whole, never "demo-01a2…".
    # The times fold first (no_wrap keeps a column out of rich's first shrink);
    # an id wider than the terminal itself folds onto a second line, whole.
    for column in ("user", "session"):
        table.add_column(column, no_wrap=True, overflow="fold")
    for column in ("updated", "created"):
        table.add_column(column, overflow="fold")
    table.add_column("last seq", justify="right", no_wrap=True)
    for s in found:
        table.add_row(Text(s.user), Text(s.session), _when(s.updated_at), _when(s.created_at), str(s.last_seq))
    table.caption = f"{len(found)} session{'' if len(found) == 1 else 's'}" + (": more with --all" if more else "")
    print_table(table)


@sessions_app.command("show")
def sessions_show(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    num_recent_events: Annotated[
        int, option("session.get", "num_recent_events", "--events", "-e", help="Show the last N events.")
    ] = 0,
    after_seq: Annotated[
        int | None, option("session.get", "after_seq", help="Show the events after this stream sequence.")
    ] = None,
    after: AfterOpt = None,
    roles: RoleOpt = None,
    min_seq: MinSeqOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a session: its ids, times and merged state (app: and user: keys prefixed).
    With --after, --after-seq or --role, also the events that pass them (the last N with --events)."""
    picked = cast("list[Role]", roles or [])  # RoleOpt held them to Role
    view = _with_client(
        app_id,
        lambda c: c.get_session(
            user,
            session,
            num_recent_events=num_recent_events or None,
            after_seq=after_seq,
            after=after,
            roles=picked,
            min_seq=min_seq,
        ),
    )
    if as_json:
        console.print_json(view.model_dump_json())
        return
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
    if view.events is not None and (view.events or after is not None or after_seq is not None or picked):
        title = f"{'last ' if num_recent_events else ''}{len(view.events)} events"
        console.print(_events_table(title, view.events))


@sessions_app.command("delete")
def sessions_delete(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a session everywhere: SQL, index, cache and the stream itself.
    A session that does not exist is an error (exit 1): nothing is published."""
    gone = (
        f"no such session {escape(repr(session))} of user {escape(repr(user))} in app {escape(repr(app_id))}:[/] "
        "nothing deleted (see `memq sessions list`)"
    )

    async def exists(client: MemoryClient) -> bool:
        try:
            await client.get_session(user, session)
        except NotFound:
            return False
        return True

    async def delete(client: MemoryClient) -> int | None:
        try:  # checked again: deleted while the question was asked
            return await client.delete_session(user, session)
        except NotFound:
            return None

    if not _with_client(app_id, exists):
        err.print(f"[red]{gone}", soft_wrap=True)
        raise typer.Exit(1)
    if not yes:
        typer.confirm(f"Delete session {session!r} of user {user!r} in app {app_id!r} for good?", abort=True)
    seq = _with_client(app_id, delete)
    if seq is None:
        err.print(f"[red]{gone}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"delete published at seq {seq}: the workers remove the session everywhere.")


@app.command()
def history(
    session: SessionArg,
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    strategy: StrategyOpt = None,
    budget: BudgetOpt = None,
    window: WindowOpt = None,
    turns: TurnsOpt = None,
    preserve_recent: PreserveRecentOpt = None,
    threshold: ThresholdOpt = None,
    target: TargetOpt = None,
    min_recent: MinRecentOpt = None,
    recall_share: RecallShareOpt = None,
    model: ModelOpt = None,
    after: AfterOpt = None,
    roles: RoleOpt = None,
    min_seq: MinSeqOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a session's history through a working-memory strategy, with token counts.
    --after/--role pick events first; the strategy then windows those."""
    spec = _strategy_spec(
        strategy,
        budget=budget,
        window=window,
        turns=turns,
        preserve_recent=preserve_recent,
        threshold=threshold,
        target=target,
        min_recent=min_recent,
        recall_share=recall_share,
    )
    picked = cast("list[Role]", roles or [])  # RoleOpt held them to Role
    view = _with_client(
        app_id,
        lambda c: c.history(user, session, strategy=spec, model=model, after=after, roles=picked, min_seq=min_seq),
    )
    if as_json:
        console.print_json(view.model_dump_json())
        return
    if view.summary:
        console.print(Panel(Text(view.summary), title=f"summary up to seq {view.checkpoint_seq}"))
    from memq.workers.memory.strategies import RULES

    kind = view.strategy.get("kind")
    rules = RULES.get(str(kind))
    params = ", ".join(f"{k} {view.strategy[k]}" for k in (rules.params if rules else ()) if view.strategy.get(k))
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
    format: Annotated[ContextFormat, typer.Option(help="memq (with per-part details) or openai.")] = "memq",
    strategy: StrategyOpt = None,
    budget: BudgetOpt = None,
    window: WindowOpt = None,
    turns: TurnsOpt = None,
    preserve_recent: PreserveRecentOpt = None,
    threshold: ThresholdOpt = None,
    target: TargetOpt = None,
    min_recent: MinRecentOpt = None,
    recall_share: RecallShareOpt = None,
    model: ModelOpt = None,
    instruction: Annotated[
        str | None,
        option(
            "context", "instruction", help="Instruction template rendered from state, e.g. 'Answer in {user:language}.'"
        ),
    ] = None,
    recall_limit: Annotated[int, option("context", "recall_limit", help="Long-term memories to recall.")] = 20,
    facts_limit: Annotated[
        int, option("context", "facts_limit", "--facts", help="Facts about the user to include (0: none).")
    ] = 0,
    message: Annotated[str | None, option("context", "message")] = None,
    min_seq: MinSeqOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the context an agent would send to its model: token counts per part, then the messages.
    It fits the budget unless the strategy is all/none or buffer_window; then it says it is over."""
    spec = _strategy_spec(
        strategy,
        budget=budget,
        window=window,
        turns=turns,
        preserve_recent=preserve_recent,
        threshold=threshold,
        target=target,
        min_recent=min_recent,
        recall_share=recall_share,
    )
    view = _with_client(
        app_id,
        lambda c: c.context(
            user,
            session,
            strategy=spec,
            model=model,
            format=format,
            instruction=instruction,
            recall_limit=recall_limit,
            facts_limit=facts_limit,
            message=message,
            min_seq=min_seq,
        ),
    )
    if as_json:
        console.print_json(view.model_dump_json())
        return
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
    for i, sent in enumerate(view.messages, 1):
        rest = {k: v for k, v in sent.items() if k not in ("role", "content")}
        content = sent.get("content") or ""
        if rest:  # tool calls, tool_call_id
            content = f"{content}\n{json.dumps(rest, ensure_ascii=False)}".strip()
        messages.add_row(str(i), sent.get("role", ""), Text(_short(content, 2000)))
    console.print(messages)


@app.command()
def search(
    query: Annotated[str, argument("search", "query", help="What to look for.")],
    user: UserOpt,
    app_id: AppOpt = DEFAULT_APP,
    session: Annotated[str | None, typer.Option("--session", "-s", help="Only this session.")] = None,
    mode: Annotated[SearchMode, typer.Option(help="keyword (BM25), vector, or hybrid.")] = "hybrid",
    k: Annotated[int, option("search", "k", "--k", "-k", help="Results.")] = 10,
    authors: Annotated[
        list[str] | None, option("search", "authors", "--author", help="Only these authors (repeatable).")
    ] = None,
    roles: Annotated[
        list[str] | None, option("search", "roles", "--role", help="Only these roles (repeatable).")
    ] = None,  # held to the contract's SearchRole by the option's callback
    since: Annotated[
        float | None,
        option(
            "search",
            "since",
            parser=parse_after,
            metavar="SPAN|DATETIME",
            help="Only memories from then on: 24h, 7d or an ISO datetime.",
        ),
    ] = None,
    until: Annotated[
        float | None,
        option(
            "search",
            "until",
            parser=parse_after,
            metavar="SPAN|DATETIME",
            help="Only memories before: 24h, 7d or an ISO datetime.",
        ),
    ] = None,
    alpha: Annotated[
        float | None, option("search", "alpha", help="Hybrid: weight of the vector side (0 to 1).")
    ] = None,
    min_seq: Annotated[
        int | None,
        # min 0, not the request's 1: 0 is the client's "do not wait" (what is indexed now)
        typer.Option(
            "--min-seq",
            min=0,
            help="Answer once this stream sequence is indexed (the user's own writes above the index are "
            "added at once); 0: at once, from what is indexed now.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search a user's long-term memory, best first."""
    found = _with_client(
        app_id,
        lambda c: c.search(
            user,
            query,
            session=session,
            mode=mode,
            k=k,
            authors=authors or (),
            roles=cast("list[SearchRole]", roles or []),
            since=since,
            until=until,
            alpha=alpha,
            min_seq=min_seq,
            # the CLI sees every writer's writes ("any"); 0 asks for none of them
            consistency="own" if min_seq == 0 else None,
        ),
    )
    if as_json:
        console.print_json(found.model_dump_json())
        return
    table = Table(
        title=f"memories of {user} for {query!r}", caption=f"{mode if not found.note else found.mode}, {found.model}"
    )
    for column in ("score", "when", "session", "author", "content"):
        table.add_column(column, justify="right" if column == "score" else "left", overflow="fold")
    for r in found.results:
        table.add_row(f"{r.score:.3f}", _when(r.timestamp), Text(r.session_id), Text(r.author), Text(_short(r.content)))
    if found.note:
        err.print(f"[yellow]note:[/] {found.note}")
    console.print(table)
