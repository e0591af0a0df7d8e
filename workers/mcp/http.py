"""`memq mcp --transport http`: the server on streamable HTTP, behind the
HTTP gateway's API keys.

Every HTTP request is checked by :class:`KeyCheck` from its headers alone,
before the MCP SDK reads its body and before anything reaches NATS, with the
gateway's own :class:`~memq.workers.http.keys.Keyring` (``http.apps``) and
its way of carrying a key (``Authorization: Bearer`` or ``X-API-Key``,
:func:`~memq.workers.http.door.presented_key`): a missing or unknown key is
a 401, another app's key a 403, answered as a JSON-RPC error (memq's code
in its ``data``), which the MCP client shows as the message itself. As at
the gateway's door, the key has at most ``http.key_inflight`` requests in
flight at once, from the key check to the end of the answer; past it, 429
``busy`` with ``Retry-After``, the body unread (the same JSON-RPC error).
One server serves one app, so this bounds what the app's callers together
make it hold (each request a body of up to ``http.max_body_bytes`` and a
wait on NATS), as the gateway bounds each app's share of it. With
no keys configured the server is open and, as the gateway, may only listen
on loopback.

Stateless and plain JSON (no SSE stream, no MCP session to keep): each call
is one POST answered by one JSON body; the tools need nothing more.

Past the key, the body is held to the gateway's limits by its own
:class:`~memq.workers.http.door.BodyGuard` (``http.max_body_bytes``, and
``http.max_json_elements``/``max_json_depth`` counted as the body arrives:
the SDK parses a body whole on the event loop, and 4 MiB of ``[{},{},…]``
cost it ~110 MB), and uvicorn runs with the gateway's deadline for reading a
request (``http.read_timeout_s``, :mod:`memq.workers.http.uvicorn_server`). Each of
their refusals (413 ``oversize``, 408 ``timed_out``) is the gateway's status
and message as the same JSON-RPC error (:func:`refusal`), naming the setting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from memq.workers.http.door import BodyGuard, BodyLimits, KeyInflight, presented_key
from memq.workers.http.keys import Keyring, Unauthenticated, WrongApp, check_open_is_local
from memq.workers.http.uvicorn_server import deadline_protocol
from memq.workers.http.worker import HttpPortTaken, bind
from memq.workers.mcp.server import app_client, build_server
from memq.workers.settings import HttpSettings, Settings

log = logging.getLogger("memq.mcp")

PATH = "/mcp"


class McpPortTaken(OSError):
    """The port `memq mcp` was asked to listen on is taken."""


class KeyCheck:
    """ASGI middleware: only requests carrying ``app``'s key get through, at
    most ``key_inflight`` of them at once (``http.key_inflight``, counted by
    the gateway's own :class:`~memq.workers.http.door.KeyInflight`; an open
    server has no key to count)."""

    def __init__(self, inner: ASGIApp, keyring: Keyring, app: str, key_inflight: int = HttpSettings().key_inflight):
        self.inner = inner
        self.keyring = keyring
        self.app = app
        self.inflight = KeyInflight(key_inflight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no transport of ours uses one: closed unread, key or not
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http":  # lifespan passes: it starts the SDK's session manager
            try:
                self.keyring.authorize(self.app, await presented_key(HTTPConnection(scope)))
            except Unauthenticated as exc:
                await refusal(401, "unauthenticated", str(exc), {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
            except WrongApp as exc:
                await refusal(403, "not_allowed", str(exc))(scope, receive, send)
                return
            if not self.keyring.open:
                await self.inflight.serve(self.app, self.inner, refusal, scope, receive, send)
                return
        await self.inner(scope, receive, send)


REFUSED = -32001  # JSON-RPC's range for server errors (-32000..-32099): the request was refused


def refusal(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """A refused request (its key, its count in flight, its body, its
    deadline) as a JSON-RPC error (memq's error code in ``data``), at the
    gateway's HTTP status: the :data:`~memq.workers.http.door.Render` of this
    server. The mcp package's client raises a JSON-RPC error body as
    ``MCPError`` with its message; any other body became "Server returned an
    error response" in a 70-line ExceptionGroup. ``id`` is null:
    the body is refused before it is parsed."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": REFUSED, "message": message, "data": {"code": code}}}
    return JSONResponse(body, status_code=status, headers=headers)


def keyring_for(settings: Settings, app: str, host: str) -> Keyring:
    """The gateway's keys, checked for serving ``app`` on ``host``.

    :raises ValueError: an open server off loopback, or keys without one for ``app``.
    """
    keyring = Keyring.from_settings(settings.http)
    check_open_is_local(keyring, host)
    if not keyring.open and app not in settings.http.apps:
        raise ValueError(
            f"app {app!r} has no API key in http.apps, so no request could be served: add one "
            f'(MEMQ_HTTP__APPS=\'{{"{app}": {{"api_key": "…"}}}}\') or serve an app that has one'
        )
    return keyring


def asgi_app(server: MCPServer, keyring: Keyring, app: str, settings: Settings, host: str) -> ASGIApp:
    """The SDK's streamable HTTP app at :data:`PATH`, behind :class:`KeyCheck`
    and then the gateway's body limits."""
    inner = server.streamable_http_app(
        streamable_http_path=PATH,
        stateless_http=True,
        json_response=True,
        max_request_body_size=settings.http.max_body_bytes,
        host=host,
    )
    guard = BodyGuard(inner, BodyLimits.from_settings(settings.http), refusal)
    return KeyCheck(guard, keyring, app, settings.http.key_inflight)


async def serve_http(
    settings: Settings,
    app: str,
    host: str,
    port: int,
    default_user: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's own handlers: the process is
    this server alone); ``on_ready(url)`` once listening.

    :raises ValueError: see :func:`keyring_for`.
    :raises McpPortTaken: the port is in use.
    """
    keyring = keyring_for(settings, app, host)  # before anything connects
    try:
        sock = bind(host, port)
    except HttpPortTaken:
        raise McpPortTaken(
            f"memq mcp cannot listen on {host}:{port}: another program listens there; "
            "pick another port with --port (0: any free port)"
        ) from None
    async with app_client(settings, app) as client:
        api = asgi_app(build_server(app, lambda: client, default_user), keyring, app, settings, host)
        config = uvicorn.Config(
            api,
            http=deadline_protocol(settings.http.read_timeout_s, refusal),
            lifespan="on",
            log_config=None,
            access_log=False,
        )
        server = uvicorn.Server(config)
        bound_host, bound_port = sock.getsockname()[:2]
        url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}{PATH}"

        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.01)
            log.info("memq mcp: app %r on %s (%s)", app, url, "open: no API keys" if keyring.open else "API keys")
            if on_ready is not None:
                on_ready(url)

        waiting = asyncio.create_task(announce())
        try:
            await server.serve(sockets=[sock])
        finally:
            waiting.cancel()
