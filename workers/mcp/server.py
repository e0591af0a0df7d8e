"""`memq mcp`'s server: the tools of :mod:`.tools` on an ``MCPServer`` (the
``mcp`` package), bound to one app, on a NATS connection of its own.

One app per server: no tool takes an app, so a server started for app A has
no way to name app B. Its client is the HTTP gateway's
(:class:`~memq.workers.http.clients.AppClients`): the app's own NATS user
where one is configured (``http.apps.<app>.nats_password`` or
``http.accounts_file``), so NATS itself fences the app, else the process's
connection. Reads use ``consistency="any"``: every write any client had
acknowledged before the read is seen (a ``remember`` then a
``search_memory``, over two requests, finds the note once it is indexed).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from pydantic import ValidationError

from memq.contracts.client import MemoryClient
from memq.workers import VERSION
from memq.workers.http.clients import AppClients
from memq.workers.mcp.tools import register
from memq.workers.runtime import bus
from memq.workers.settings import Settings


def instructions(app: str, default_user: str | None) -> str:
    """What a client shows the model about this server."""
    who = f"user {default_user!r} unless a call names another" if default_user else "the user each call names"
    return (
        f"memq: long-term memory and conversations of app {app!r}, for {who}. "
        "Search memory before answering questions about the past; remember facts worth keeping."
    )


def bad_arguments(exc: ValidationError) -> str:
    """One line naming each field, as memq's errors read (``invalid_request:
    …``), for pydantic's report on the model the SDK made of a tool's
    parameters: its title ("search_memoryArguments") is no name a caller
    knows, and its URL and input types are noise to a model."""
    said = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "arguments"
        given = err.get("input")
        shown = repr(given) if err["type"] != "missing" and isinstance(given, int | float | str | None) else ""
        said.append(f"argument `{field}`: {err['msg']}" + (f" (got {shown[:40]})" if shown else ""))
    return "invalid_request: " + "; ".join(said)


class Server(MCPServer):
    """``MCPServer`` whose tool errors for bad arguments say which tool and field."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            # the SDK's prefix kept; its cause stays the ValidationError, which it logs by field names
            raise ToolError(f"Error executing tool {name}: {bad_arguments(cause)}") from cause


def build_server(app: str, client_for: Callable[[], MemoryClient], default_user: str | None = None) -> MCPServer:
    """The MCP server of ``app``, its tools calling ``client_for()``."""
    server: MCPServer = Server(
        "memq", version=VERSION, instructions=instructions(app, default_user), warn_on_duplicate_tools=True
    )
    register(server, client_for, default_user)
    return server


@contextlib.asynccontextmanager
async def app_client(settings: Settings, app: str) -> AsyncIterator[MemoryClient]:
    """The app's client, as the gateway makes it, for as long as the block runs.

    :raises bus.NatsUnreachable, bus.NatsNotFound, bus.NatsTLSError: as any command.
    """
    nc = await bus.open_connection(bus.connect_options(settings, "mcp"))
    clients = AppClients(settings, nc, kind="mcp")
    try:
        await clients.open(only=app)
        yield clients.get(app)
    finally:
        await clients.close()
        await nc.close()


async def serve_stdio(settings: Settings, app: str, default_user: str | None = None) -> None:
    """Serve on stdin/stdout until the client closes them."""
    async with app_client(settings, app) as client:
        await build_server(app, lambda: client, default_user).run_stdio_async()
