"""The gateway's front door: the API key and the body's size, checked before
a byte of the body is read.

FastAPI reads and parses a route's whole body before its dependencies run,
so a key checked by a dependency alone let anyone make the gateway hold and
parse whatever they sent, and neither Starlette nor uvicorn limits a body
(uvicorn bounds only the headers). :class:`FrontDoor` is a pure ASGI
middleware (not Starlette's ``BaseHTTPMiddleware``, which wraps the body in
a stream of its own) in front of the routes:

- a request under ``/v1/apps/{app}/`` is authorized from its headers alone
  (:meth:`Keyring.authorize <memq.workers.http.keys.Keyring.authorize>`,
  the routes' own check), refused with the routes' own 401/403 otherwise;
- a ``Content-Length`` above ``http.max_body_bytes`` is refused with 413 at
  once; a body without one (chunked) is counted as it arrives and refused
  with 413 as soon as it passes the cap, so the door holds at most the cap.

A refused body is never read: uvicorn stops reading a request the app does
not read (it pauses at 64 KiB) and discards the rest once the answer is sent.
"""

from __future__ import annotations

from typing import Any

from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memq.workers.http.keys import Keyring, Unauthenticated, WrongApp
from memq.workers.http.models import ErrorBody
from memq.workers.http.paths import segment_id

# The ways a request carries its key; the routes declare the same two (OpenAPI).
BEARER = HTTPBearer(auto_error=False, description="the app's API key as a bearer token")
API_KEY_HEADER = APIKeyHeader(name="X-API-Key", auto_error=False, description="the app's API key")


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """Every error the gateway answers: ``{"error": {"code", "message"}}``."""
    body = ErrorBody.model_validate({"error": {"code": code, "message": message}})
    return Response(body.model_dump_json(), status_code=status, media_type="application/json", headers=headers)


def unauthenticated(exc: Unauthenticated) -> Response:
    return error_response(401, "unauthenticated", str(exc), {"WWW-Authenticate": "Bearer"})


def wrong_app(exc: WrongApp) -> Response:
    return error_response(403, "not_allowed", str(exc))


def too_large(limit: int) -> Response:
    return error_response(
        413,
        "oversize",
        f"the request body is over the gateway's limit of {limit} bytes (http.max_body_bytes): "
        "send fewer events per request",
    )


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


class FrontDoor:
    """The ASGI middleware of the module doc."""

    def __init__(self, app: ASGIApp, keyring: Keyring, max_body_bytes: int):
        self.app = app
        self.keyring = keyring
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = await self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        body = await self._read_capped(receive)
        if isinstance(body, Response):
            await body(scope, receive, send)
            return
        if body is None:  # the client went away
            return
        replay = iter(body)

        async def replayed() -> Message:
            # The body as it came, then the real channel (disconnects).
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    async def _refusal(self, scope: Scope) -> Response | None:
        conn = HTTPConnection(scope)  # headers and path only: it cannot read the body
        path, root = scope["path"], scope.get("root_path", "")
        app = path_app(path[len(root) :] if root and path.startswith(root) else path)  # as the router sees it
        if app is not None:
            try:
                self.keyring.authorize(app, await presented_key(conn))
            except Unauthenticated as exc:
                return unauthenticated(exc)
            except WrongApp as exc:
                return wrong_app(exc)
        declared = conn.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return too_large(self.max_body_bytes)
        return None

    async def _read_capped(self, receive: Receive) -> list[Any] | Response | None:
        """The body's messages, read up to the cap; a 413 past it; None if
        the client disconnected. Held here rather than counted as the app
        reads: the 413 is then sent before the app has answered anything."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                return too_large(self.max_body_bytes)
            messages.append(message)
            if not message.get("more_body", False):
                return messages
