"""The tools of `memq mcp`: each one :class:`~memq.contracts.client.MemoryClient`
call of the server's one app, described for a model.

The arguments are typed with the contract's vocabularies and limits
(:mod:`memq.contracts.queries`) and its id check, so a tool's JSON schema
offers what a request may say, and the SDK (pydantic) refuses anything else
as a tool error before memq is asked. Replies are the contract's reply models: the SDK
sends each as structured content (with its output schema) and as JSON text.

A memq error (not found, conflict, unavailable, bad id…) is a tool error with
its code and message (``isError``), never a protocol error: the model reads
it and can change its call.

One memory (an event: a search result carries its session and seq) is
forgotten with ``forget_memory``; a whole session with ``forget_session``.
"""

# No `from __future__ import annotations`: the SDK reads the tools' annotations
# at run time, and `User` is local to register().
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeAlias, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import AfterValidator, BaseModel, Field

from memq.contracts.client import MemoryClient
from memq.contracts.errors import InvalidId, MemqError
from memq.contracts.ids import validate_id
from memq.contracts.queries import (
    MAX_K,
    MAX_PAGE,
    ContextFormat,
    ContextView,
    FactsView,
    HistoryView,
    Role,
    SearchMode,
    SearchResults,
    SessionsPage,
    StrategyName,
)

NOTES_SESSION = "notes"  # where `remember` puts a note given no session

T = TypeVar("T")


def _id(what: str) -> AfterValidator:
    """The contract's id check (:func:`~memq.contracts.ids.validate_id`, no NUL),
    raising ValueError: pydantic makes only that a validation error, so a bad
    id is the model's tool error instead of the server's crash."""

    def check(value: str) -> str:
        try:
            validate_id(value, what)
        except InvalidId as exc:
            raise ValueError(exc.message) from None
        if "\x00" in value:
            raise ValueError(f"{what} must not contain NUL (U+0000)")
        return value

    return AfterValidator(check)


UserId = Annotated[str, Field(min_length=1), _id("user")]
SessionId = Annotated[str, Field(min_length=1), _id("session")]


class Remembered(BaseModel):
    """What ``remember`` answers: where the text went and its stream sequence."""

    user: str
    session: str
    seq: int


class Forgotten(BaseModel):
    """What ``forget_session`` answers."""

    user: str
    session: str
    seq: int


class ForgottenMemory(BaseModel):
    """What ``forget_memory`` answers: the memory forgotten and the forget's own sequence."""

    user: str
    session: str
    memory_seq: int
    seq: int


def user_argument(default_user: str | None) -> str:
    """The description of every tool's ``user`` argument on this server."""
    if default_user is not None:
        return f"the user whose memory this is; leave it out for this server's user ({default_user!r})"
    return "the user whose memory this is (required: this server has no default user)"


async def _memq(call: Awaitable[T]) -> T:
    """``call``, its memq error turned into a tool error the model can read."""
    try:
        return await call
    except MemqError as exc:
        raise ToolError(f"{exc.code}: {exc.message}") from None


def register(server: MCPServer, client_for: Callable[[], MemoryClient], default_user: str | None = None) -> None:
    """Add the tools to ``server``. ``client_for()`` gives the app's client
    (the server's one app); ``default_user`` the user a call without
    ``user`` acts for (None: every call must name one)."""
    User: TypeAlias = Annotated[UserId | None, Field(description=user_argument(default_user))]
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)

    def who(user: str | None) -> str:
        if user is not None:
            return user
        if default_user is None:
            raise ToolError("give `user`: this server has no default user (start it with `memq mcp --user <id>`)")
        return default_user

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
        structured_output=True,
    )
    async def remember(
        text: Annotated[str, Field(min_length=1, max_length=200_000, description="the note or the turn's text")],
        session: Annotated[
            SessionId | None,
            Field(description=f"the conversation it belongs to; default {NOTES_SESSION!r}, the user's notes"),
        ] = None,
        role: Annotated[Role, Field(description="who said it: user (default), assistant, system or tool")] = "user",
        user: User = None,
    ) -> Remembered:
        """Remember something: append a note, or a turn of a conversation, to the user's memory.
        It is searchable with search_memory (and part of the session's context) once indexed, in a
        moment. Use it for facts, preferences and decisions worth recalling in later conversations."""
        user = who(user)
        session = session or NOTES_SESSION
        seq = await _memq(client_for().append_text(user, session, role, text))
        return Remembered(user=user, session=session, seq=seq)

    @server.tool(annotations=read_only, structured_output=True)
    async def search_memory(
        query: Annotated[
            str, Field(min_length=1, max_length=8192, description="what to look for, in words or keywords")
        ],
        k: Annotated[int, Field(ge=1, le=MAX_K, description="how many memories at most (default 5)")] = 5,
        session: Annotated[SessionId | None, Field(description="only this conversation; default: all")] = None,
        mode: Annotated[
            SearchMode, Field(description="hybrid (default): words and meaning; keyword: exact words; vector: meaning")
        ] = "hybrid",
        user: User = None,
    ) -> SearchResults:
        """Search the user's long-term memory (every conversation and note), best match first.
        Only memories that relate to the query come back (a relevance floor): an empty list means
        nothing relevant is remembered. Use it when the user refers to something said before, or
        when facts about them (names, dates, plans, preferences) would help."""
        return await _memq(client_for().search(who(user), query, k=k, session=session, mode=mode))

    @server.tool(annotations=read_only, structured_output=True)
    async def known_facts(
        query: Annotated[
            str | None,
            Field(max_length=8192, description="only facts that share these words, best first; default: all"),
        ] = None,
        include_invalid: Annotated[
            bool, Field(description="also facts that are no longer true (default false)")
        ] = False,
        limit: Annotated[int, Field(ge=1, le=MAX_K, description="how many facts at most (default 20)")] = 20,
        user: User = None,
    ) -> FactsView:
        """What is known about the user: short statements (where they live, what they like, plan or
        did) that memq derived from past conversations, each with the turns it came from and since
        when it holds. Empty when facts are off or nothing is known yet; `behind` > 0 means recent
        conversations are still being read. Prefer it to search_memory for stable facts about the user."""
        return await _memq(client_for().facts(who(user), query or None, include_invalid=include_invalid, limit=limit))

    @server.tool(annotations=read_only, structured_output=True)
    async def get_context(
        session: Annotated[SessionId, Field(description="the conversation")],
        message: Annotated[
            str | None,
            Field(
                max_length=200_000, description="the user's next message, not stored yet: placed last, recall uses it"
            ),
        ] = None,
        budget: Annotated[
            int | None, Field(ge=1, le=10_000_000, description="token budget; default: the app's (8000)")
        ] = None,
        recall_limit: Annotated[
            int, Field(ge=0, le=100, description="long-term memories to recall into it (default 20)")
        ] = 20,
        facts_limit: Annotated[
            int, Field(ge=0, le=100, description="facts known about the user to include (default 0: none)")
        ] = 0,
        format: Annotated[
            ContextFormat,
            Field(description="memq (default): parts with token counts; openai: chat messages only"),
        ] = "memq",
        user: User = None,
    ) -> ContextView:
        """What a model should see of a conversation, within a token budget: facts known about the user
        (with facts_limit), memories recalled for it, the summary of older turns and the recent turns,
        with each part's token count."""
        strategy = {"budget": budget} if budget is not None else None
        return await _memq(
            client_for().context(
                who(user),
                session,
                strategy=strategy,
                format=format,
                recall_limit=recall_limit,
                facts_limit=facts_limit,
                message=message,
            )
        )

    @server.tool(annotations=read_only, structured_output=True)
    async def list_sessions(
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE, description="how many at most (default 20)")] = 20,
        cursor: Annotated[
            str | None, Field(max_length=512, description="next_cursor of the previous call, for the next page")
        ] = None,
        user: User = None,
    ) -> SessionsPage:
        """The user's conversations (sessions), most recently updated first; next_cursor pages on."""
        return await _memq(client_for().list_sessions(who(user), limit=limit, cursor=cursor))

    @server.tool(annotations=read_only, structured_output=True)
    async def read_session(
        session: Annotated[SessionId, Field(description="the conversation")],
        strategy: Annotated[
            StrategyName,
            Field(
                description="all (default): every turn; buffer_window: the last `window` turns; "
                "token_window: the newest turns within `budget`; summary_buffer: a summary plus recent turns"
            ),
        ] = "all",
        window: Annotated[int | None, Field(ge=1, le=100_000, description="buffer_window: how many events")] = None,
        budget: Annotated[
            int | None, Field(ge=1, le=10_000_000, description="token_window, summary_buffer: token budget")
        ] = None,
        user: User = None,
    ) -> HistoryView:
        """A conversation's history: its events oldest first, with token counts (and, for
        summary_buffer, the summary of what came before)."""
        spec: dict[str, Any] = {"kind": strategy}
        spec.update({k: v for k, v in (("window", window), ("budget", budget)) if v is not None})
        return await _memq(client_for().history(who(user), session, strategy=spec))

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False),
        structured_output=True,
    )
    async def forget_session(
        session: Annotated[SessionId, Field(description="the conversation to delete")],
        user: User = None,
    ) -> Forgotten:
        """Forget a conversation for good: its turns, state and summaries, and its memories in search.
        To forget one memory alone, use forget_memory. A conversation that does not exist is an
        error and nothing is deleted."""
        user = who(user)
        seq = await _memq(client_for().delete_session(user, session))
        return Forgotten(user=user, session=session, seq=seq)

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True),
        structured_output=True,
    )
    async def forget_memory(
        session: Annotated[SessionId, Field(description="the memory's conversation: session_id of a search result")],
        seq: Annotated[
            int, Field(ge=1, description="the memory's sequence: metadata.seq of a search result (or an event's seq)")
        ],
        user: User = None,
    ) -> ForgottenMemory:
        """Forget one memory for good: that turn or note leaves the conversation's history, its
        context and search, and cannot come back. A summary that already covered it keeps what it
        says. A seq that is not a memory of that conversation is an error and nothing is forgotten.
        Use it when the user asks to forget something they said, or a note is wrong."""
        user = who(user)
        forget = await _memq(client_for().forget_event(user, session, seq))
        return ForgottenMemory(user=user, session=session, memory_seq=seq, seq=forget)
