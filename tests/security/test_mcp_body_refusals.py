"""`memq mcp --transport http` refuses a body as the gateway does (413 past
``http.max_body_bytes``, ``http.max_json_elements`` or ``http.max_json_depth``,
408 past ``http.read_timeout_s``), and answers each refusal as a JSON-RPC
error, as its 401/403/429 (issue 38): the `mcp` package's client then raises
``MCPError`` with memq's message, naming the setting. With the gateway's
``{"error": {"code", "message"}}`` it raised only "Server returned an error
response". Against a real ``memq mcp`` process on a real NATS; a body is
refused before any tool runs, so no worker is needed."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest
from helpers import make_settings, mcp_http, settings_env
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from services import NatsServer
from services import running as running_service

pytestmark = pytest.mark.timeout(300)

APP, KEY = "mcpbody-a", "key-of-mcpbody-a-0123456789"
LIMITS = {  # small enough to pass with a few KiB of arguments; a tools/list is far within them all
    "MEMQ_HTTP__MAX_BODY_BYTES": "65536",
    "MEMQ_HTTP__MAX_JSON_ELEMENTS": "2000",
    "MEMQ_HTTP__MAX_JSON_DEPTH": "20",
    "MEMQ_HTTP__READ_TIMEOUT_S": "2",
}


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    """`memq mcp --transport http` for APP with the limits above: its URL, from its ready line."""
    tmp: Path = tmp_path_factory.mktemp("mcpbody")
    with running_service(NatsServer) as nats:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        env = settings_env(settings) | LIMITS | {"MEMQ_HTTP__APPS": json.dumps({APP: {"api_key": KEY}})}
        with mcp_http(env, APP) as (url, _):
            yield url


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def refused_call(url: str, arguments: dict) -> MCPError:
    """What the SDK's client raises for a ``remember`` with ``arguments``, on
    a connection that has just listed the tools (so the body is what is refused)."""
    client = Client(
        streamable_http_client(
            url, http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        )
    )
    with pytest.raises(BaseException) as raised:  # the SDK may wrap it in its task group's ExceptionGroup
        async with client as mcp:
            assert (await mcp.list_tools()).tools  # the control: served within the limits
            await mcp.call_tool("remember", arguments)
    exc = raised.value
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    assert isinstance(exc, MCPError), raised.value
    assert "Server returned an error response" not in str(exc) and "\n" not in str(exc), str(exc)
    return exc


@pytest.mark.parametrize(
    "setting, extra",
    [
        ("http.max_body_bytes", {"text": "x" * 100_000}),
        ("http.max_json_elements", {"tags": [0] * 3000}),  # ~6 KB: under the byte limit
        ("http.max_json_depth", {"tags": nested(30)}),
    ],
)
async def test_the_mcp_client_shows_which_body_limit_refused_it(url: str, setting: str, extra: dict):
    exc = await refused_call(url, {"session": "s", "text": "hello"} | extra)
    assert setting in str(exc), str(exc)
    assert exc.error.data == {"code": "oversize"}, exc.error


def test_a_request_past_the_read_timeout_is_a_json_rpc_408(url: str):
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        head = (
            f"POST {parts.path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"jsonrpc": ')  # then nothing
        answer = b""
        while data := sock.recv(65536):  # the server closes once it has answered
            answer += data
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), answer[:200]
    refused = json.loads(body)
    assert (refused["jsonrpc"], refused["id"], refused["error"]["data"]) == ("2.0", None, {"code": "timed_out"})
    assert "http.read_timeout_s" in refused["error"]["message"]
