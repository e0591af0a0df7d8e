"""One app's key cannot hold the whole gateway (issue 38): past
``http.key_inflight`` requests in flight it is refused 429 ``busy`` at the
door, while another app's key is served; places are given back when a
request ends, a client that goes away included. Against a real ``memq
worker http`` process, its cap set to 2; A holds its two places with
requests whose bodies never finish (each would otherwise hold the gateway
for ``http.read_timeout_s`` and up to a 4 MiB body)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from helpers import WorkerProcess, make_settings
from services import NatsServer
from services import running as running_service

pytestmark = pytest.mark.timeout(300)

A, B = "inflight-a", "inflight-b"
KEYS = {A: "key-of-inflight-a-0123456789", B: "key-of-inflight-b-9876543210"}
CAP = 2
TURN = {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": "hello"}]}}


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("inflight")
    with running_service(NatsServer) as server:
        settings = make_settings(server.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        env = {
            "MEMQ_HTTP__PORT": "0",
            "MEMQ_HTTP__APPS": json.dumps({a: {"api_key": k} for a, k in KEYS.items()}),
            "MEMQ_HTTP__KEY_INFLIGHT": str(CAP),
        }
        proc = WorkerProcess(settings, tmp / "http.log", kind="http", env=env).start()
        try:
            proc.wait_ready()
            yield (settings.run_dir / "http.url").read_text().strip()
        finally:
            proc.stop()


def append(url: str, app: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {KEYS[app]}"}) as http:
        return http.post(f"/v1/apps/{app}/users/u/sessions/s/events", json={"events": [TURN]})


def unfinished(url: str, app: str) -> socket.socket:
    """A request of ``app`` whose body never ends: it stays in flight at the door."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    head = (
        f"POST /v1/apps/{app}/users/u/sessions/s/events HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {KEYS[app]}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"events": [')
    return sock


def refused_busy(response: httpx.Response) -> bool:
    return response.status_code == 429 and response.json()["error"]["code"] == "busy"


def test_a_key_past_its_cap_is_refused_and_another_apps_key_is_served(gateway_url: str):
    assert append(gateway_url, A).status_code == 202  # the control: within its cap
    held = [unfinished(gateway_url, A) for _ in range(CAP)]
    try:
        deadline = time.monotonic() + 30  # until the gateway has read both requests' heads
        while not refused_busy(over := append(gateway_url, A)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused_busy(over), (over.status_code, over.text[:300])
        assert "http.key_inflight" in over.json()["error"]["message"] and over.headers["Retry-After"] == "1"
        assert append(gateway_url, B).status_code == 202  # B's key is not counted with A's
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30  # the gateway sees the clients go away, and gives their places back
    while (after := append(gateway_url, A)).status_code != 202 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after.status_code == 202, (after.status_code, after.text[:300])
