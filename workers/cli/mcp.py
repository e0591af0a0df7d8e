"""`memq mcp`: memq's memory as MCP tools for one app (:mod:`memq.workers.mcp`)."""

from __future__ import annotations

import asyncio
import contextlib
from enum import Enum
from typing import Annotated

import typer
from rich.markup import escape

from memq.workers.cli.common import _settings, app, err, nats_failures
from memq.workers.cli.reads import DEFAULT_APP, AppOpt

DEFAULT_PORT = 8481  # the gateway's 8480, plus one
INSTALL = "pip install 'memq[mcp]'"


class Transport(str, Enum):
    stdio = "stdio"
    http = "http"


def _fail(line: str) -> typer.Exit:
    err.print(f"[red]{escape(line)}[/]", soft_wrap=True, highlight=False)
    return typer.Exit(1)


@app.command("mcp")
def mcp_command(
    app_id: AppOpt = DEFAULT_APP,
    user: Annotated[
        str | None,
        typer.Option("--user", "-u", help="The user a tool call acts for when it names none. Default: calls name one."),
    ] = None,
    transport: Annotated[
        Transport, typer.Option(help="stdio (a client starts the server) or http (streamable HTTP, API keys).")
    ] = Transport.stdio,
    host: Annotated[str, typer.Option(help="http: the address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="http: the port (0: any free one).")] = DEFAULT_PORT,
) -> None:
    """Serve memq's memory to MCP clients (assistants, IDEs, agent frameworks): tools to
    remember, search, get a session's context, list, read and forget sessions, for one app.

    On http, every request needs the app's API key of the HTTP gateway (http.apps),
    as `Authorization: Bearer <key>`; the endpoint is http://HOST:PORT/mcp.
    """
    from memq.workers.cli.preflight import _installed, port_problem

    if not _installed("mcp"):
        raise _fail(f"the mcp package is not installed, and `memq mcp` needs it: {INSTALL}")
    if not 0 <= port <= 65535:
        raise _fail(f"--port {port} is not a port (0-65535; 0: any free port)")
    settings = _settings()
    if transport is Transport.http and (
        problem := port_problem(
            "memq mcp",
            host,
            port,
            "stop the program that listens there, or pick another with --port (0: any free port)",
        )
    ):
        raise _fail(problem)

    from memq.contracts.errors import MemqError
    from memq.workers.mcp.http import McpPortTaken, serve_http
    from memq.workers.mcp.server import serve_stdio

    def ready(url: str) -> None:
        err.print(f"memq mcp ready: app {app_id} on {url}", markup=False, highlight=False, soft_wrap=True)

    refused: tuple[type[Exception], ...] = (ValueError, McpPortTaken, MemqError, *nats_failures())
    try:
        with contextlib.suppress(KeyboardInterrupt):
            if transport is Transport.http:
                asyncio.run(serve_http(settings, app_id, host, port, user, on_ready=ready))
            else:
                asyncio.run(serve_stdio(settings, app_id, user))
    except refused as exc:  # one line, no traceback
        raise _fail(str(exc)) from None
