"""`memq mcp` driven by the mcp package's own client, over stdio (the server a
child process, as a desktop assistant starts it) and over streamable HTTP
(on a free loopback port, behind the gateway's API keys), against a real
stack: every tool, the tools' schemas, bad arguments as tool errors, apps
kept apart, keys refused."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import httpx2
import jsonschema
import pytest
from helpers import running_query, running_worker
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from test_http_gateway import KEYS, gateway_settings, indexing

from memq.contracts.client import MemoryClient
from memq.workers.settings import Settings

MEMQ = str(Path(sys.prefix) / "bin" / "memq")
TOOLS = {
    "remember",
    "search_memory",
    "known_facts",
    "get_context",
    "list_sessions",
    "read_session",
    "forget_session",
    "forget_memory",
}


def mcp_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(
        MEMQ_NATS__URL=settings.nats.url or "",
        MEMQ_DATA_DIR=str(settings.data_dir),
        MEMQ_LOG_LEVEL="WARNING",
        MEMQ_HTTP__APPS=json.dumps({app: {"api_key": key} for app, key in KEYS.items()}),
        **extra,
    )
    return env


@asynccontextmanager
async def stack(settings: Settings):
    """The workers a tool call needs: persistence, query, and a keyword-only indexer."""
    async with running_worker(settings), running_query(settings), indexing(settings):
        yield


def stdio_server(settings: Settings, app: str, user: str | None = "u") -> Client:
    args = ["mcp", "--app", app, *(["--user", user] if user else [])]
    return Client(StdioServerParameters(command=MEMQ, args=args, env=mcp_env(settings)), read_timeout_seconds=60)


@asynccontextmanager
async def http_server(settings: Settings, app: str, env: dict[str, str] | None = None):
    """`memq mcp --transport http` on any free loopback port: its URL, read from its ready line."""
    proc = await asyncio.create_subprocess_exec(
        MEMQ, "mcp", "--transport", "http", "--port", "0", "--app", app, "--user", "u",
        env=mcp_env(settings) | (env or {}), stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = []
        while True:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            lines.append(line)
            assert line, f"memq mcp exited: {''.join(lines)}"
            if found := re.search(r"ready: app \S+ on (http://\S+)", line):
                break
        yield found[1]
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def http_client(url: str, key: str | None) -> Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


async def call(client: Client, tool: str, **arguments) -> dict:
    """A tool call that must succeed: its structured result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # the text a model reads is the same JSON
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


class ToolFailure(str):
    @property
    def code(self) -> str | None:
        """memq's error code in the message (the SDK puts its own words first)."""
        found = re.search(r"Error executing tool \w+: (\w+): ", self)
        return found[1] if found else None


async def tool_error(client: Client, tool: str, **arguments) -> ToolFailure:
    """A tool call that must fail as a tool error (not a protocol error): its message."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result
    return ToolFailure(result.content[0].text)


async def test_stdio_every_tool_schemas_and_bad_arguments(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings), stdio_server(settings, "app-a") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert len(tool.description or "") > 60, tool.name  # a model needs to know when to call it
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)
            assert tool.input_schema["type"] == "object"
            jsonschema.Draft202012Validator.check_schema(tool.output_schema)
        assert tools["search_memory"].input_schema["required"] == ["query"]
        assert tools["search_memory"].input_schema["properties"]["mode"]["enum"] == ["keyword", "vector", "hybrid"]
        assert tools["forget_session"].annotations.destructive_hint is True
        assert tools["search_memory"].annotations.read_only_hint is True

        note = await call(mcp, "remember", text="Ana's daughter Lila turns seven on the 14th of May.")
        assert note["session"] == "notes" and note["user"] == "u" and note["seq"] >= 1
        await call(mcp, "remember", session="s1", text="Which tea helps me sleep?")
        await call(mcp, "remember", session="s1", role="assistant", text="Chamomile, an hour before bed.")

        found = await call(mcp, "search_memory", query="Lila birthday", mode="keyword")
        assert [r["content"] for r in found["results"]] == ["Ana's daughter Lila turns seven on the 14th of May."]
        assert (await call(mcp, "search_memory", query="zeppelin", mode="keyword"))["results"] == []

        context = await call(mcp, "get_context", session="s1", format="openai", message="And for a nap?")
        assert [m["content"] for m in context["messages"]][-3:] == [
            "Which tea helps me sleep?",
            "Chamomile, an hour before bed.",
            "And for a nap?",
        ]
        assert context["tokens"]["total"] > 0

        sessions = await call(mcp, "list_sessions")
        assert {s["session"] for s in sessions["sessions"]} == {"s1", "notes"}
        history = await call(mcp, "read_session", session="s1")
        assert [e["event"]["message"]["role"] for e in history["events"]] == ["user", "assistant"]
        window = await call(mcp, "read_session", session="s1", strategy="buffer_window", window=1)
        assert [e["event"]["message"]["role"] for e in window["events"]] == ["assistant"]
        other = await call(mcp, "remember", user="v", text="v's own note")
        assert other["user"] == "v"
        assert {s["session"] for s in (await call(mcp, "list_sessions", user="v"))["sessions"]} == {"notes"}

        # one memory, as search_memory shows it: its session and seq
        slip = await call(mcp, "remember", text="Ana's PIN is 4417, a slip")
        hit = (await call(mcp, "search_memory", query="PIN 4417", mode="keyword"))["results"][0]
        assert (hit["session_id"], hit["metadata"]["seq"]) == ("notes", slip["seq"])
        gone = await call(mcp, "forget_memory", session=hit["session_id"], seq=hit["metadata"]["seq"])
        assert gone["memory_seq"] == slip["seq"] and gone["seq"] > slip["seq"]
        assert (await call(mcp, "search_memory", query="PIN 4417", mode="keyword"))["results"] == []
        assert (await tool_error(mcp, "forget_memory", session="notes", seq=slip["seq"])).code == "not_found"
        assert "seq" in await tool_error(mcp, "forget_memory", session="notes", seq=0)
        assert tools["forget_memory"].annotations.destructive_hint is True
        assert [r["content"] for r in (await call(mcp, "search_memory", query="Lila", mode="keyword"))["results"]] == [
            "Ana's daughter Lila turns seven on the 14th of May."
        ]

        forgotten = await call(mcp, "forget_session", session="s1")
        assert forgotten["session"] == "s1"
        assert (await tool_error(mcp, "read_session", session="s1")).code == "not_found"
        assert (await tool_error(mcp, "forget_session", session="s1")).code == "not_found"
        assert {s["session"] for s in (await call(mcp, "list_sessions"))["sessions"]} == {"notes"}

        # bad arguments: a tool error that names the field, and the server goes on
        # (issue 40: it read "1 validation error for search_memoryArguments" over four lines)
        for tool, arguments, field in (
            ("search_memory", {"query": "tea", "k": 0}, "k"),
            ("search_memory", {}, "query"),
            ("search_memory", {"query": "tea", "mode": "psychic"}, "mode"),
            ("remember", {"text": "x", "role": "narrator"}, "role"),
        ):
            said = await tool_error(mcp, tool, **arguments)
            assert said.startswith(f"Error executing tool {tool}: invalid_request: argument `{field}`: "), said
            assert said.code == "invalid_request" and "\n" not in said and "Arguments" not in said, said
        assert "(got 0)" in await tool_error(mcp, "search_memory", query="tea", k=0)
        assert "session" in await tool_error(mcp, "get_context", session="a" * 10_000)
        assert "budget" in await tool_error(mcp, "get_context", session="notes", budget=-5)
        assert "window" in await tool_error(mcp, "read_session", session="notes", window="many")
        unknown = await mcp.call_tool("no_such_tool", {})
        assert unknown.is_error
        assert (await call(mcp, "list_sessions"))["sessions"]  # still serving


async def test_stdio_without_a_default_user_asks_for_one(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings), stdio_server(settings, "app-a", user=None) as mcp:
        assert "no default user" in await tool_error(mcp, "list_sessions")
        await call(mcp, "remember", user="w", text="w was here")
        assert [s["session"] for s in (await call(mcp, "list_sessions", user="w"))["sessions"]] == ["notes"]


async def test_stdio_server_of_one_app_cannot_reach_another(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings):
        async with await MemoryClient.connect(nats_url, app="app-b") as b:
            await b.append_text("u", "secret", "user", "app-b's launch code is zebra")
        async with stdio_server(settings, "app-a") as mcp:
            await call(mcp, "remember", text="app-a knows about zebras too")
            assert (await call(mcp, "list_sessions"))["sessions"][0]["app"] == "app-a"
            assert {s["session"] for s in (await call(mcp, "list_sessions"))["sessions"]} == {"notes"}
            found = await call(mcp, "search_memory", query="zebra launch code", mode="keyword")
            assert [r["content"] for r in found["results"]] == ["app-a knows about zebras too"]
            assert (await tool_error(mcp, "read_session", session="secret")).code == "not_found"
            assert (await tool_error(mcp, "forget_session", session="secret")).code == "not_found"
            # no tool takes an app: there is no argument to name another one with
            for tool in (await mcp.list_tools()).tools:
                assert "app" not in tool.input_schema["properties"]
        async with stdio_server(settings, "app-b") as mcp_b:  # app-b's data is still there
            assert [s["session"] for s in (await call(mcp_b, "list_sessions"))["sessions"]] == ["secret"]


async def test_http_tools_keys_and_isolation(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings), http_server(settings, "app-a") as url_a, http_server(settings, "app-b") as url_b:
        async with http_client(url_a, KEYS["app-a"]) as mcp:
            assert {t.name for t in (await mcp.list_tools()).tools} == TOOLS
            await call(mcp, "remember", session="trip", text="Flight to Lisbon on the 3rd, window seat.")
            found = await call(mcp, "search_memory", query="Lisbon flight", mode="keyword")
            assert [r["session_id"] for r in found["results"]] == ["trip"]
            context = await call(mcp, "get_context", session="trip")
            assert context["tokens"]["window"] > 0
            assert "k" in await tool_error(mcp, "search_memory", query="x", k=1000)

        # refused before anything reaches NATS, with the gateway's statuses and error body
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        async with httpx.AsyncClient(timeout=30) as raw:
            for headers, status, code in (
                ({}, 401, "unauthenticated"),
                ({"Authorization": "Bearer not-a-key"}, 401, "unauthenticated"),
                ({"Authorization": f"Bearer {KEYS['app-b']}"}, 403, "not_allowed"),
                ({"X-API-Key": KEYS["app-b"]}, 403, "not_allowed"),
            ):
                refused = await raw.post(url_a, json=initialize, headers=headers)
                assert refused.status_code == status, (headers, refused.text)
                assert refused.json()["error"]["data"]["code"] == code  # a JSON-RPC error, memq's code in data
        for key, said in (
            (None, "an API key is required"),
            ("not-a-key", "unknown API key"),
            (KEYS["app-b"], "not for app"),
        ):
            assert said in await refused_connect(url_a, key)

        # app-b's own server, with app-b's key, sees none of app-a's data
        async with http_client(url_b, KEYS["app-b"]) as mcp_b:
            assert (await call(mcp_b, "search_memory", query="Lisbon flight", mode="keyword"))["results"] == []
            assert (await call(mcp_b, "list_sessions"))["sessions"] == []
            assert (await tool_error(mcp_b, "read_session", session="trip")).code == "not_found"


async def refused_connect(url: str, key: str | None) -> str:
    """The message of the error the SDK's client raises as it connects: one
    line, memq's own (issue 40: "Server returned an error response")."""
    with pytest.raises(BaseException) as raised:  # the SDK wraps it in an ExceptionGroup of its task group
        async with http_client(url, key) as refused_client:
            await refused_client.list_tools()
    exc = raised.value
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    assert isinstance(exc, MCPError), raised.value
    assert "\n" not in str(exc) and "Server returned an error response" not in str(exc), str(exc)
    return str(exc)


async def test_http_on_an_open_server_a_key_is_refused_in_one_line_and_none_is_served(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path, apps={})  # as `memq up`: no keys
    async with stack(settings), http_server(settings, "app-a", {"MEMQ_HTTP__APPS": "{}"}) as url:
        said = await refused_connect(url, "some-key")
        assert "no API keys configured" in said and "without an Authorization or X-API-Key header" in said
        async with http_client(url, None) as mcp:  # what the message says to do
            assert {t.name for t in (await mcp.list_tools()).tools} == TOOLS


def _memq(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([MEMQ, *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_taken_or_bad_port_is_one_line_and_exit_1(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")} | {"MEMQ_DATA_DIR": str(tmp_path)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _memq("mcp", "--transport", "http", "--port", str(port), env=env)
    assert out.returncode == 1, out
    assert out.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
    out = _memq("mcp", "--transport", "http", "--port", "70000", env=env)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "70000" in out.stderr, out


def test_an_open_server_off_loopback_or_an_app_without_a_key_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")} | {"MEMQ_DATA_DIR": str(tmp_path)}
    # no NATS needed: refused before connecting
    env["MEMQ_NATS__URL"] = "nats://127.0.0.1:1"
    out = _memq("mcp", "--transport", "http", "--host", "0.0.0.0", "--port", "0", env=env)
    assert out.returncode == 1 and "every app without a key" in out.stderr, out
    keyed = env | {"MEMQ_HTTP__APPS": json.dumps({"app-b": {"api_key": KEYS["app-b"]}})}
    out = _memq("mcp", "--transport", "http", "--app", "app-a", "--port", "0", env=keyed)
    assert out.returncode == 1 and "app 'app-a' has no API key" in out.stderr, out


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_no_nats_is_one_line_and_exit_1(tmp_path, transport):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")} | {
        "MEMQ_DATA_DIR": str(tmp_path),
        "MEMQ_NATS__URL": "nats://127.0.0.1:1",
    }
    out = _memq("mcp", "--transport", transport, "--port", "0", env=env)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out
    assert "cannot reach NATS at nats://127.0.0.1:1" in out.stderr and out.stdout == "", out
