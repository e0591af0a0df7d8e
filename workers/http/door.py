"""The gateway's front door: the API key, the body's size and the JSON it
holds, checked before the routes see a byte of the body.

FastAPI reads and parses a route's whole body before its dependencies run,
so a key checked by a dependency alone let anyone make the gateway hold and
parse whatever they sent, and neither Starlette nor uvicorn limits a body
(uvicorn bounds only the headers). :class:`FrontDoor` is a pure ASGI
middleware (not Starlette's ``BaseHTTPMiddleware``, which wraps the body in
a stream of its own) in front of the routes:

- every request is authenticated from its headers alone, before its body is
  read: under ``/v1/apps/{app}/`` with that app's key
  (:meth:`Keyring.authorize <memq.workers.http.keys.Keyring.authorize>`, the
  routes' own check: 401/403), on any other path with any app's key (401
  without one, whatever the path: a keyless caller learns no route and makes
  the gateway read nothing). Only the API's own documents (``GET``
  ``/openapi.json`` and ``/docs``) are served without a key, and never read
  a body;
- a ``Content-Length`` above ``http.max_body_bytes`` is refused with 413 at
  once; a body without one (chunked) is counted as it arrives and refused
  with 413 as soon as it passes the cap, so the door holds at most the cap;
- the JSON in the body is counted as it arrives (:mod:`.budget`): past
  ``http.max_json_elements`` elements or ``http.max_json_depth`` levels it
  is refused with 413 at the chunk that passes, before anything parses it.
  FastAPI then parses at most that much, on the event loop.

- one app's key has at most ``http.key_inflight`` requests in the gateway
  at once (from the door to the end of the answer): past it, 429 ``busy``
  with ``Retry-After``, its body unread. Each request in flight may hold a
  body of up to the cap in memory and waits on NATS, so without it one
  app's slow or huge requests (long waits for a ``min_seq``, 4 MiB bodies)
  could grow the gateway without bound while others shared it.

A refused body is never read: uvicorn stops reading a request the app does
not read (it pauses at 64 KiB) and discards the rest once the answer is sent,
for at most ``http.read_timeout_s`` (:mod:`.uvicorn_server`).

:func:`read_body` and :class:`BodyGuard` are the same body checks, and
:class:`KeyInflight` the same count, for another ASGI app (``memq mcp
--transport http``), which says how each refusal is answered (a
:data:`Render`): the same status, code and message in its own body.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memq.workers.http.budget import JsonBudget, OverBudget
from memq.workers.http.keys import Keyring, Unauthenticated, WrongApp
from memq.workers.http.models import ErrorBody
from memq.workers.http.paths import segment_id
from memq.workers.memory.shares import Caps
from memq.workers.settings import HttpSettings

# The ways a request carries its key; the routes declare the same two (OpenAPI).
BEARER = HTTPBearer(auto_error=False, description="the app's API key as a bearer token")
API_KEY_HEADER = APIKeyHeader(name="X-API-Key", auto_error=False, description="the app's API key")


@dataclass(frozen=True)
class BodyLimits:
    """What one request body may be: ``http.max_body_bytes``,
    ``http.max_json_elements``, ``http.max_json_depth``."""

    max_bytes: int
    max_json_elements: int
    max_json_depth: int

    @classmethod
    def from_settings(cls, http: HttpSettings) -> BodyLimits:
        return cls(http.max_body_bytes, http.max_json_elements, http.max_json_depth)


DEFAULT_LIMITS = BodyLimits.from_settings(HttpSettings())


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """Every error the gateway answers: ``{"error": {"code", "message"}}``."""
    body = ErrorBody.model_validate({"error": {"code": code, "message": message}})
    return Response(body.model_dump_json(), status_code=status, media_type="application/json", headers=headers)


# How a refusal is answered, from (status, code, message, headers): the
# gateway's is error_response; `memq mcp` answers a JSON-RPC error, which its
# client shows (any other body it reports as "Server returned an error response").
Render = Callable[[int, str, str, dict[str, str] | None], Response]


def unauthenticated(exc: Unauthenticated) -> Response:
    return error_response(401, "unauthenticated", str(exc), {"WWW-Authenticate": "Bearer"})


def wrong_app(exc: WrongApp) -> Response:
    return error_response(403, "not_allowed", str(exc))


def too_large(limit: int, render: Render = error_response) -> Response:
    return render(
        413,
        "oversize",
        f"the request body is over the server's limit of {limit} bytes (http.max_body_bytes): "
        "send fewer events per request",
        None,
    )


BUSY_RETRY_AFTER = {"Retry-After": "1"}


def busy_message(app: str, cap: int) -> str:
    return f"app {app!r} has {cap} requests in flight on this server with its key, its cap (http.key_inflight): retry later"


def key_busy(app: str, cap: int, render: Render = error_response) -> Response:
    return render(429, "busy", busy_message(app, cap), BUSY_RETRY_AFTER)


def over_budget(exc: OverBudget, render: Render = error_response) -> Response:
    return render(413, "oversize", str(exc), None)


async def presented_key(conn: HTTPConnection) -> str | None:
    """The key a request carries: a bearer token, else ``X-API-Key``."""
    token = await BEARER(conn)
    return token.credentials if token is not None else await API_KEY_HEADER(conn)


def path_app(path: str) -> str | None:
    """The ``{app}`` of ``/v1/apps/{app}/…`` as the router matches it (one
    segment of the path :class:`~.paths.RawSegments` made), or None for any other path."""
    parts = path.split("/", 4)
    if len(parts) >= 4 and parts[1] == "v1" and parts[2] == "apps" and parts[3]:
        return segment_id(parts[3])
    return None


def routed_path(scope: Scope) -> str:
    """The path as the router sees it (without the ``root_path``)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def declared_too_large(scope: Scope, limits: BodyLimits, render: Render = error_response) -> Response | None:
    """A 413 for a ``Content-Length`` over the cap, before a byte is read."""
    declared = HTTPConnection(scope).headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
        return too_large(limits.max_bytes, render)
    return None


async def read_body(
    receive: Receive, limits: BodyLimits, render: Render = error_response
) -> list[Message] | Response | None:
    """A request's body messages, read up to the cap and counted for JSON;
    the 413 of the first limit it passes (the rest is left unread); None if
    the client disconnected. Held here rather than counted as the app reads:
    the 413 is then sent before the app has answered anything."""
    messages: list[Message] = []
    budget = JsonBudget(limits.max_json_elements, limits.max_json_depth)
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.max_bytes:
            return too_large(limits.max_bytes, render)
        try:
            budget.feed(chunk)  # this chunk's bytes only: no long scan holds the loop
        except OverBudget as exc:
            return over_budget(exc, render)
        messages.append(message)
        if not message.get("more_body", False):
            return messages


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages``, then the real channel (disconnects)."""
    replay = iter(messages)

    async def replayed() -> Message:
        return next(replay, None) or await receive()

    return replayed


async def guarded(
    app: ASGIApp,
    limits: BodyLimits,
    scope: Scope,
    receive: Receive,
    send: Send,
    render: Render = error_response,
) -> None:
    """Call ``app`` with the body once it is read within ``limits``, or answer the 413."""
    refusal = declared_too_large(scope, limits, render)
    body = refusal if refusal is not None else await read_body(receive, limits, render)
    if isinstance(body, Response):
        await body(scope, receive, send)
    elif body is not None:  # None: the client went away
        await app(scope, replaying(body, receive), send)


class BodyGuard:
    """ASGI middleware: the body limits of :class:`FrontDoor` alone, for an
    app that checks keys itself (``memq mcp --transport http``), its 413s
    answered by ``render``."""

    def __init__(self, app: ASGIApp, limits: BodyLimits = DEFAULT_LIMITS, render: Render = error_response):
        self.app = app
        self.limits = limits
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await guarded(self.app, self.limits, scope, receive, send, self.render)


class KeyInflight:
    """At most ``cap`` requests of one app's key in flight at once
    (``http.key_inflight``), from the key check to the end of the answer: the
    count of :class:`FrontDoor` and of ``memq mcp --transport http``'s key check."""

    def __init__(self, cap: int = HttpSettings().key_inflight):
        self.caps = Caps(cap)

    @property
    def cap(self) -> int:
        return self.caps.cap

    def count(self, owner: str) -> int:
        return self.caps.count(owner)

    async def serve(
        self,
        owner: str,
        app: ASGIApp,
        render: Render,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Call ``app`` holding one of ``owner``'s places, given back however
        it ends (a client gone away included); past the cap, 429 ``busy``
        (:func:`key_busy`, answered by ``render``), the body unread."""
        if not self.caps.take(owner):
            await key_busy(owner, self.caps.cap, render)(scope, receive, send)
            return
        try:
            await app(scope, receive, send)
        finally:
            self.caps.give(owner)


EMPTY_BODY: Message = {"type": "http.request", "body": b"", "more_body": False}


class FrontDoor:
    """The ASGI middleware of the module doc. ``public``: the paths served
    to ``GET``/``HEAD`` without a key (the API's documents), never with a
    body; ``key_inflight``: the requests one app's key may have in flight
    (``http.key_inflight``; an open gateway has no keys to count)."""

    def __init__(
        self,
        app: ASGIApp,
        keyring: Keyring,
        limits: BodyLimits = DEFAULT_LIMITS,
        public: Collection[str] = (),
        key_inflight: int = HttpSettings().key_inflight,
    ):
        self.app = app
        self.keyring = keyring
        self.limits = limits
        self.public = frozenset(public)
        self.inflight = KeyInflight(key_inflight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = routed_path(scope)
        if scope["method"] in ("GET", "HEAD") and path in self.public:
            # Nothing of what it sent is read: the document's route takes no body.
            await self.app(scope, replaying([EMPTY_BODY], receive), send)
            return
        owner = await self._owner(scope, path)
        if isinstance(owner, Response):
            await owner(scope, receive, send)
            return
        if owner is None:  # an open gateway: no key to count by
            await guarded(self.app, self.limits, scope, receive, send)
            return
        await self.inflight.serve(owner, self._guarded, error_response, scope, receive, send)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        await guarded(self.app, self.limits, scope, receive, send)

    async def _owner(self, scope: Scope, path: str) -> str | Response | None:
        """The app whose key the request carries (None on an open gateway),
        or the 401/403 refusing it."""
        key = await presented_key(HTTPConnection(scope))  # headers only: it cannot read the body
        app = path_app(path)
        try:
            if app is not None:
                self.keyring.authorize(app, key)
            # no route of an app: any app's key (a 404 then), none is a 401
            return self.keyring.authenticate(key)
        except Unauthenticated as exc:
            return unauthenticated(exc)
        except WrongApp as exc:
            return wrong_app(exc)
