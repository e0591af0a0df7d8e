"""`memq mcp`'s HTTP front (workers/mcp/http.py, KeyCheck): a request gets to
the MCP SDK only with its app's key, checked from the headers; nothing else
reaches it (pure ASGI, no server)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import SecretStr

from memq.workers.http.keys import Keyring
from memq.workers.mcp.http import KeyCheck, keyring_for
from memq.workers.settings import HttpSettings, Settings

KEYS = {"app-a": "key-of-a-0123456789", "app-b": "key-of-b-9876543210"}


def keyring() -> Keyring:
    return Keyring.from_settings(HttpSettings(apps={a: {"api_key": SecretStr(k)} for a, k in KEYS.items()}))


async def serve(scope_type: str, headers: dict[str, str]) -> tuple[list[dict], list[str]]:
    """One request through KeyCheck for app-a: what it sent, and what reached the inner app."""
    reached: list[str] = []
    sent: list[dict] = []

    async def inner(scope, receive, send):
        reached.append(scope["type"])

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": scope_type,
        "path": "/mcp",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    await KeyCheck(inner, keyring(), "app-a")(scope, receive, send)
    return sent, reached


@pytest.mark.parametrize(
    "headers, status, code",
    [
        ({}, 401, "unauthenticated"),
        ({"Authorization": "Bearer nope"}, 401, "unauthenticated"),
        ({"Authorization": f"Bearer {KEYS['app-b']}"}, 403, "not_allowed"),
        ({"X-API-Key": KEYS["app-b"]}, 403, "not_allowed"),
    ],
)
async def test_a_request_without_its_apps_key_never_reaches_the_sdk(headers, status, code):
    sent, reached = await serve("http", headers)
    assert reached == []
    assert sent[0]["status"] == status
    body = json.loads(sent[1]["body"])  # a JSON-RPC error, which the mcp client raises with its message
    assert body["jsonrpc"] == "2.0" and body["id"] is None and isinstance(body["error"]["code"], int)
    assert body["error"]["data"]["code"] == code and body["error"]["message"]


@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEYS['app-a']}"}, {"X-API-Key": KEYS["app-a"]}])
async def test_the_apps_key_gets_through(headers):
    sent, reached = await serve("http", headers)
    assert reached == ["http"] and sent == []


async def test_a_websocket_is_closed_even_with_the_key():
    sent, reached = await serve("websocket", {"Authorization": f"Bearer {KEYS['app-a']}"})
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_a_server_for_an_app_without_a_key_or_open_off_loopback_is_refused():
    keyed = Settings(http={"apps": {"app-b": {"api_key": KEYS["app-b"]}}})
    with pytest.raises(ValueError, match="app 'app-a' has no API key"):
        keyring_for(keyed, "app-a", "127.0.0.1")
    assert not keyring_for(keyed, "app-b", "0.0.0.0").open
    with pytest.raises(ValueError, match="without a key"):
        keyring_for(Settings(), "app-a", "0.0.0.0")
    assert keyring_for(Settings(), "app-a", "127.0.0.1").open


async def test_the_apps_key_past_its_in_flight_cap_is_429_busy_unread_and_gives_places_back():
    release = asyncio.Event()
    reached: list[str] = []
    read = 0

    async def inner(scope, receive, send):
        reached.append(scope["type"])
        await release.wait()  # a slow answer (a tool waiting on NATS)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        nonlocal read
        read += 1
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def through(key: str) -> list[dict]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/mcp", "root_path": "", "query_string": b"",
                 "headers": [(b"authorization", f"Bearer {key}".encode())]}  # fmt: skip
        await check(scope, receive, send)
        return sent

    check = KeyCheck(inner, keyring(), "app-a", key_inflight=1)
    held = asyncio.create_task(through(KEYS["app-a"]))
    while not reached:
        await asyncio.sleep(0)
    busy = await through(KEYS["app-a"])
    assert (busy[0]["status"], dict(busy[0]["headers"])[b"retry-after"], reached, read) == (429, b"1", ["http"], 0)
    body = json.loads(busy[1]["body"])  # a JSON-RPC error, as the 401/403
    assert body["id"] is None and body["error"]["data"]["code"] == "busy"
    assert "http.key_inflight" in body["error"]["message"]
    assert (await through(KEYS["app-b"]))[0]["status"] == 403  # another key: refused for itself, never counted
    release.set()
    assert (await held)[0]["status"] == 200
    assert (await through(KEYS["app-a"]))[0]["status"] == 200 and check.inflight.count("app-a") == 0
