"""The REST routes of the HTTP gateway (FastAPI), in the shape of ADK's and
Hector's session endpoints: ``/v1/apps/{app}/users/{user}/sessions/{session}``
with its ``events``, ``history``, ``context`` and ``state``, plus ``search``.

Each route is one :class:`~memq.contracts.client.MemoryClient` call of the
app the path names, after its API key is checked (:mod:`.keys`): reads are
requests to the query service, writes are publishes to the event log, so
the gateway adds HTTP and nothing else. Paged reads (a session's events,
history, context) answer one page of the query service's and its
``next_cursor``; ask again with ``cursor=`` for the next. Writes answer
``202`` with the stream sequence; a read given ``min_seq=`` that sequence
sees the write (read-your-writes, as every memq read).

Sessions that do not exist: an append starts one (``"create": false`` in
the body refuses it with 404 instead); a delete answers 404 and deletes
nothing. On the user's state path an unprefixed key means ``user:<key>``.

Every error is ``{"error": {"code", "message"}}``: 401 (no or unknown key),
403 (another app's key, or refused by NATS), 404, 409 (``min_seq`` not
committed in time), 413, 422 (bad input), 503 (no query service, NATS
away), 500.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations
# at run time, and `Client` is local to build_api.
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from memq.contracts.client import MemoryClient, event_filters
from memq.contracts.errors import InvalidRequest, MemqError
from memq.contracts.queries import (
    ContextFormat,
    ContextGet,
    ContextView,
    HistoryView,
    Search,
    SearchMode,
    SearchResults,
    SessionGet,
    SessionsList,
    SessionsPage,
    SessionView,
    StateView,
    StrategyName,
    StrategySpec,
)
from memq.contracts.schemas import Timestamp, user_scoped, user_scoped_delta
from memq.workers.http.door import API_KEY_HEADER, BEARER, FrontDoor, error_response, unauthenticated, wrong_app
from memq.workers.http.keys import Keyring, Unauthenticated, WrongApp
from memq.workers.http.models import (
    Accepted,
    Appended,
    ErrorBody,
    EventsPage,
    NewEvents,
    NewSession,
    SessionCreated,
    StateChange,
)
from memq.workers.http.params import field, query
from memq.workers.redact import Redactor
from memq.workers.settings import HttpSettings

log = logging.getLogger("memq.http")

API_VERSION = "1"
DEFAULT_MAX_BODY_BYTES = HttpSettings().max_body_bytes
SHAPES_ONLY = Redactor()  # URLs, paths and addresses, without the settings' own values
Role = Literal["user", "assistant", "system", "tool"]

# The statuses the routes answer with: each error class says its own (contracts/errors.py).
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (401, "no API key, or an unknown one"),
        (403, "the key is another app's, or NATS refused the app's request"),
        (404, "no such session"),
        (409, "min_seq was not committed in time: retry"),
        (413, "the body is over http.max_body_bytes, or an event over the message size limit"),
        (422, "bad input: the message says which field"),
        (503, "the query service or NATS is unavailable: retry"),
    )
}

# --- parameters shared by routes ------------------------------------------------

App = Annotated[str, Path(description="the app id (the API key must be this app's)")]
User = Annotated[str, Path(description="the user id")]
Session = Annotated[str, Path(description="the session id")]
MinSeq = Annotated[
    int | None,
    query(ContextGet, "min_seq", "answer once this stream sequence (a write's `seq`) is committed: read-your-writes"),
]
Cursor = Annotated[str | None, query(ContextGet, "cursor", "`next_cursor` of the previous page")]
After = Annotated[Timestamp | None, Query(description="only events whose timestamp is later (unix seconds)")]
Roles = Annotated[list[Role], Query(description="only events with these message roles (repeat the parameter)")]
StrategyKind = Annotated[StrategyName | None, Query(description="working-memory strategy; default: the app's")]
Budget = Annotated[int | None, query(StrategySpec, "budget", "token budget; default: the app's")]
Window = Annotated[int | None, query(StrategySpec, "window", "buffer_window: last N messages")]
Turns = Annotated[int | None, query(StrategySpec, "turns", "buffer_window: last N user turns")]
Model = Annotated[str | None, query(ContextGet, "model", "count tokens as this model; default: the app's")]
Limit = Annotated[int, query(SessionsList, "limit", "sessions per page")]


def _strategy(kind: str | None, budget: int | None, window: int | None, turns: int | None) -> dict | None:
    spec = {
        k: v for k, v in (("kind", kind), ("budget", budget), ("window", window), ("turns", turns)) if v is not None
    }
    return spec or None


def _json(model: BaseModel, status: int = 200) -> Response:
    # Serialized once, as the model says; FastAPI would validate it again first.
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


_error = error_response


class ContextBody(BaseModel):
    """A context request in a body (long instructions and messages do not fit a
    URL): the contract's fields, the strategy flat as in the GET's parameters."""

    strategy: StrategyName | None = None
    budget: int | None = field(StrategySpec, "budget")
    window: int | None = field(StrategySpec, "window")
    turns: int | None = field(StrategySpec, "turns")
    model: str | None = field(ContextGet, "model")
    format: ContextFormat = field(ContextGet, "format")
    instruction: str | None = field(ContextGet, "instruction")
    recall_limit: int = field(ContextGet, "recall_limit")
    message: str | None = field(ContextGet, "message")
    cursor: str | None = field(ContextGet, "cursor")
    min_seq: int | None = field(ContextGet, "min_seq")


def build_api(
    keyring: Keyring,
    client_for: Callable[[str], MemoryClient],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    redact: Callable[[str], str] = SHAPES_ONLY,
) -> FastAPI:
    """The gateway's FastAPI app: ``client_for(app)`` gives the client of an
    app whose key was checked (see :mod:`.clients`), behind the
    :class:`~.door.FrontDoor` that checks the key and caps the body before
    the body is read. ``redact`` scrubs the message of every memq error
    answered (:mod:`memq.workers.redact`; default: of URLs, paths and
    addresses, without knowing the gateway's settings)."""
    api = FastAPI(
        title="memq HTTP gateway",
        version=API_VERSION,
        summary="Sessions, events, history, context, search and state of memq over HTTP",
        description=(__doc__ or "").split("\n\n", 1)[1],
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
        responses=_ERRORS,
    )
    api.add_middleware(FrontDoor, keyring=keyring, max_body_bytes=max_body_bytes)

    def client(
        app: App,
        token: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
        key: Annotated[str | None, Depends(API_KEY_HEADER)],
    ) -> MemoryClient:
        # The door has refused a bad key already, before the body was read;
        # checked again here so that no route depends on the door being there.
        keyring.authorize(app, token.credentials if token is not None else key)
        return client_for(app)

    Client = Annotated[MemoryClient, Depends(client)]

    @api.exception_handler(MemqError)
    async def memq_error(request: Request, exc: MemqError) -> Response:
        # A query worker's message is scrubbed already; the gateway's own client errors (NATS) are not.
        message = redact(exc.message)
        if message != exc.message:
            log.warning("an error named server details, which the answer leaves out: %s", exc.message)
        return _error(exc.http_status, exc.code, message, {"Retry-After": "1"} if exc.retry_later else None)

    @api.exception_handler(Unauthenticated)
    async def on_unauthenticated(request: Request, exc: Unauthenticated) -> Response:
        return unauthenticated(exc)

    @api.exception_handler(WrongApp)
    async def on_wrong_app(request: Request, exc: WrongApp) -> Response:
        return wrong_app(exc)

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3]
        )  # loc: ("query", "limit"), ("body", "events", 0, …)
        return _error(422, InvalidRequest.code, problems or "invalid request")

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        return _error(exc.status_code, code, str(exc.detail), dict(exc.headers or {}))

    base = "/v1/apps/{app}/users/{user}"
    session_path = base + "/sessions/{session}"

    # --- sessions -------------------------------------------------------------

    @api.get("/v1/apps/{app}/sessions", response_model=SessionsPage, tags=["sessions"])
    async def list_app_sessions(
        client: Client,
        user: Annotated[str | None, Query(description="only this user's sessions")] = None,
        limit: Limit = 50,
        cursor: Cursor = None,
        min_seq: MinSeq = None,
    ) -> Response:
        """A page of the app's sessions (of every user, or one), most recently updated first."""
        return _json(await client.list_sessions(user, limit=limit, cursor=cursor, min_seq=min_seq))

    @api.get(base + "/sessions", response_model=SessionsPage, tags=["sessions"])
    async def list_sessions(
        client: Client,
        user: User,
        limit: Limit = 50,
        cursor: Cursor = None,
        min_seq: MinSeq = None,
    ) -> Response:
        """A page of a user's sessions, most recently updated first; `next_cursor` asks for the next."""
        return _json(await client.list_sessions(user, limit=limit, cursor=cursor, min_seq=min_seq))

    @api.post(base + "/sessions", response_model=SessionCreated, status_code=201, tags=["sessions"])
    async def create_session(client: Client, user: User, body: NewSession) -> Response:
        """Create a session (stored once the persistence worker commits `seq`)."""
        ref = await client.create_session(user, body.session_id, body.state)
        return _json(SessionCreated(app=ref.app, user=ref.user, session=ref.session, seq=ref.seq), 201)

    @api.get(session_path, response_model=SessionView, tags=["sessions"])
    async def get_session(
        client: Client,
        user: User,
        session: Session,
        events: Annotated[bool, Query(description="include the events (one page of them)")] = False,
        num_recent_events: Annotated[int | None, query(SessionGet, "num_recent_events")] = None,
        after_seq: Annotated[int | None, query(SessionGet, "after_seq")] = None,
        after: After = None,
        roles: Roles = [],  # noqa: B006 - FastAPI copies a parameter's default per request
        cursor: Cursor = None,
        min_seq: MinSeq = None,
    ) -> Response:
        """A session with its merged state; with `events`, one page of its events (`next_cursor`)."""
        wants_events = events or num_recent_events is not None or after_seq is not None or after is not None or roles
        view = await client.page(
            "session.get",
            min_seq=min_seq,
            user=user,
            session=session,
            events=bool(wants_events),
            num_recent_events=num_recent_events,
            after_seq=after_seq,
            cursor=cursor,
            **event_filters(after, roles),
        )
        return _json(view)

    @api.delete(session_path, response_model=Accepted, status_code=202, tags=["sessions"])
    async def delete_session(client: Client, user: User, session: Session) -> Response:
        """Delete a session everywhere (SQL, index, cache, stream, artifacts), in stream order;
        404 if it does not exist (never created, or deleted already)."""
        return _json(Accepted(seq=await client.delete_session(user, session)), 202)

    # --- events -------------------------------------------------------------------

    @api.get(session_path + "/events", response_model=EventsPage, tags=["events"])
    async def list_events(
        client: Client,
        user: User,
        session: Session,
        after_seq: Annotated[int | None, query(SessionGet, "after_seq", "only events after this sequence")] = None,
        after: After = None,
        roles: Roles = [],  # noqa: B006
        cursor: Cursor = None,
        min_seq: MinSeq = None,
    ) -> Response:
        """One page of a session's events, oldest first; `next_cursor` asks for the next."""
        view = await client.page(
            "session.get",
            min_seq=min_seq,
            user=user,
            session=session,
            events=True,
            after_seq=after_seq,
            cursor=cursor,
            **event_filters(after, roles),
        )
        return _json(EventsPage(events=view.events or [], next_cursor=view.next_cursor))

    @api.post(session_path + "/events", response_model=Appended, status_code=202, tags=["events"])
    async def append_events(client: Client, user: User, session: Session, body: NewEvents) -> Response:
        """Append events in order; each is in the log once JetStream has stored it. An append
        to a session that does not exist starts it, unless `create` is false (then 404)."""
        seqs = await client.append_many(user, session, body.events, expect_seq=body.expect_seq, create=body.create)
        return _json(Appended(seq=max(seqs), seqs=seqs), 202)

    # --- working memory -----------------------------------------------------------

    @api.get(session_path + "/history", response_model=HistoryView, tags=["memory"])
    async def history(
        client: Client,
        user: User,
        session: Session,
        strategy: StrategyKind = None,
        budget: Budget = None,
        window: Window = None,
        turns: Turns = None,
        model: Model = None,
        after: After = None,
        roles: Roles = [],  # noqa: B006
        cursor: Cursor = None,
        min_seq: MinSeq = None,
    ) -> Response:
        """A session's events as a working-memory strategy keeps them, with token counts (one page)."""
        view = await client.page(
            "history",
            min_seq=min_seq,
            user=user,
            session=session,
            strategy=_strategy(strategy, budget, window, turns),
            model=model,
            cursor=cursor,
            **event_filters(after, roles),
        )
        return _json(view)

    async def _context(client: MemoryClient, user: str, session: str, q: ContextBody) -> Response:
        view: ContextView = await client.page(
            "context",
            min_seq=q.min_seq,
            user=user,
            session=session,
            strategy=_strategy(q.strategy, q.budget, q.window, q.turns),
            model=q.model,
            format=q.format,
            instruction=q.instruction,
            recall_limit=q.recall_limit,
            message=q.message,
            cursor=q.cursor,
        )
        return _json(view)

    @api.get(session_path + "/context", response_model=ContextView, tags=["memory"])
    async def context(
        client: Client,
        user: User,
        session: Session,
        strategy: StrategyKind = None,
        budget: Budget = None,
        window: Window = None,
        turns: Turns = None,
        model: Model = None,
        format: Annotated[ContextFormat, Query(description="`memq` or `openai` (chat messages)")] = "memq",
        instruction: Annotated[
            str | None, query(ContextGet, "instruction", "system instruction template, from state")
        ] = None,
        recall_limit: Annotated[int, query(ContextGet, "recall_limit", "long-term memories to recall")] = 20,
        message: Annotated[str | None, query(ContextGet, "message", "a user message not stored yet")] = None,
        cursor: Cursor = None,
        min_seq: MinSeq = None,
    ) -> Response:
        """What to send to the model: recalled memories, summary and recent window within the budget (one page)."""
        q = ContextBody(
            strategy=strategy,
            budget=budget,
            window=window,
            turns=turns,
            model=model,
            format=format,
            instruction=instruction,
            recall_limit=recall_limit,
            message=message,
            cursor=cursor,
            min_seq=min_seq,
        )
        return await _context(client, user, session, q)

    @api.post(session_path + "/context", response_model=ContextView, tags=["memory"])
    async def context_from_body(client: Client, user: User, session: Session, body: ContextBody) -> Response:
        """The same as GET, its parameters in a JSON body (for long instructions and messages)."""
        return await _context(client, user, session, body)

    @api.get(base + "/search", response_model=SearchResults, tags=["memory"])
    async def search(
        client: Client,
        user: User,
        q: Annotated[str, query(Search, "query", "what to look for")],
        session: Annotated[str | None, Query(description="only this session")] = None,
        mode: Annotated[SearchMode, Query()] = "hybrid",
        k: Annotated[int, query(Search, "k")] = 10,
        authors: Annotated[list[str], Query(description="only these authors")] = [],  # noqa: B006
        roles: Annotated[list[Literal[Role, "summary"]], Query()] = [],  # noqa: B006
        since: Annotated[float | None, Query(description="timestamp >= since")] = None,
        until: Annotated[float | None, Query(description="timestamp < until")] = None,
        alpha: Annotated[float | None, query(Search, "alpha")] = None,
        min_seq: Annotated[int | None, query(Search, "min_seq", "answer once this sequence is indexed")] = None,
    ) -> Response:
        """Search the user's long-term memory (all their sessions, or one), best first."""
        results = await client.search(
            user,
            q,
            session=session,
            mode=mode,
            k=k,
            authors=authors,
            roles=roles,
            since=since,
            until=until,
            alpha=alpha,
            min_seq=min_seq,
        )
        return _json(results)

    # --- state --------------------------------------------------------------------

    async def _change_state(client: MemoryClient, user: str, session: str | None, body: StateChange) -> Response:
        if not body.set and not body.delete:
            raise InvalidRequest("nothing to change: give `set`, `delete` or both")
        changes, deletes = body.set, body.delete
        if session is None:  # the user's path: an unprefixed key is the user's own
            try:
                changes = user_scoped_delta(changes)
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
            deletes = [user_scoped(k) for k in deletes]
        if both := sorted(set(changes) & set(deletes)):
            raise InvalidRequest(f"keys both set and deleted: {both}")
        seq = 0
        if deletes:  # deletes and sets apply in stream order; no key is in both
            seq = await client.delete_state(user, deletes, session=session)
        if changes:
            seq = await client.set_state(user, changes, session=session)
        return _json(Accepted(seq=seq), 202)

    @api.get(base + "/state", response_model=StateView, tags=["state"])
    async def user_state(client: Client, user: User, min_seq: MinSeq = None) -> Response:
        """The user's and the app's state (`user:` and `app:` keys)."""
        return _json(StateView(state=await client.get_state(user, min_seq=min_seq)))

    @api.patch(base + "/state", response_model=Accepted, status_code=202, tags=["state"])
    async def change_user_state(client: Client, user: User, body: StateChange) -> Response:
        """Set and delete the user's state outside any session: an unprefixed key means
        `user:<key>` (reads show it so); `app:` and `temp:` keys are taken as they are."""
        return await _change_state(client, user, None, body)

    @api.get(session_path + "/state", response_model=StateView, tags=["state"])
    async def session_state(client: Client, user: User, session: Session, min_seq: MinSeq = None) -> Response:
        """The merged state a session sees (its keys, then `user:` and `app:` keys)."""
        return _json(StateView(state=await client.get_state(user, session, min_seq=min_seq)))

    @api.patch(session_path + "/state", response_model=Accepted, status_code=202, tags=["state"])
    async def change_session_state(client: Client, user: User, session: Session, body: StateChange) -> Response:
        """Set and delete a session's state keys (prefixed keys reach the user's or the app's state)."""
        return await _change_state(client, user, session, body)

    return api
