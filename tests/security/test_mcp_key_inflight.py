"""`memq mcp --transport http` caps its app's key as the gateway does (issue
38): past ``http.key_inflight`` requests in flight the key is refused 429
``busy`` (a JSON-RPC error, as its 401/403) with ``Retry-After``, before the
body is read, while another app's server is served; places are given back
when a request ends, a client that goes away included. Against real
``memq mcp`` processes for apps A and B on one NATS, their cap set to 2; A
holds its two places with requests whose bodies never finish (each would
otherwise hold the server for ``http.read_timeout_s`` and up to a 4 MiB body).

One server serves one app, so without the cap the ones stalled are the
app's own other callers, and the server's memory grows without bound."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from helpers import make_settings, mcp_http, settings_env
from services import NatsServer
from services import running as running_service

from memq.workers.settings import Settings

pytestmark = pytest.mark.timeout(300)

A, B = "mcpcap-a", "mcpcap-b"
KEYS = {A: "key-of-mcpcap-a-0123456789", B: "key-of-mcpcap-b-9876543210"}
CAP = 2
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}  # no NATS: the door alone


@contextmanager
def mcp_server(settings: Settings, app: str) -> Iterator[str]:
    """`memq mcp --transport http` for ``app``: its URL, from its ready line."""
    env = settings_env(settings) | {
        "MEMQ_HTTP__APPS": json.dumps({a: {"api_key": k} for a, k in KEYS.items()}),
        "MEMQ_HTTP__KEY_INFLIGHT": str(CAP),
    }
    with mcp_http(env, app) as (url, _):
        yield url


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, str]]:
    tmp: Path = tmp_path_factory.mktemp("mcpcap")
    with running_service(NatsServer) as nats, ExitStack() as stack:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        yield {app: stack.enter_context(mcp_server(settings, app)) for app in (A, B)}


def tools_list(url: str, app: str) -> httpx.Response:
    with httpx.Client(timeout=60, headers={**HEADERS, "Authorization": f"Bearer {KEYS[app]}"}) as http:
        return http.post(url, json=TOOLS_LIST)


def served(response: httpx.Response) -> bool:
    return response.status_code == 200 and bool(response.json()["result"]["tools"])


def unfinished(url: str, app: str) -> socket.socket:
    """A request of ``app`` whose body never ends: it stays in flight at the door."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS[app]}\r\n"
        f"Accept: {HEADERS['Accept']}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"jsonrpc": ')
    return sock


def refused_busy(response: httpx.Response) -> bool:
    if response.status_code != 429:
        return False
    error = response.json()["error"]  # JSON-RPC's, memq's code in its data (the mcp client shows the message)
    return error["data"]["code"] == "busy" and response.json()["id"] is None


def test_a_key_past_its_cap_is_refused_and_another_apps_server_is_served(servers: dict[str, str]):
    a, b = servers[A], servers[B]
    assert served(first := tools_list(a, A)), first.text[:300]  # the control: within its cap
    held = [unfinished(a, A) for _ in range(CAP)]
    try:
        deadline = time.monotonic() + 30  # until the server has read both requests' heads
        while not refused_busy(over := tools_list(a, A)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused_busy(over), (over.status_code, over.text[:300])
        assert "http.key_inflight" in over.json()["error"]["message"] and over.headers["Retry-After"] == "1"
        assert served(other := tools_list(b, B)), other.text[:300]  # B's server does not count A's key
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30  # the server sees the clients go away, and gives their places back
    while not served(after := tools_list(a, A)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served(after), (after.status_code, after.text[:300])
