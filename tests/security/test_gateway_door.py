"""The HTTP gateway's front door under attack (issue 27, item 3), against a
real ``memq worker http`` process with a key per app.

A request that will be refused must cost the gateway no memory: no key, a
wrong key, a declared or streamed body over ``http.max_body_bytes``. Memory
is the gateway process's own peak resident set (``VmHWM``), reset before
each attack (``/proc/<pid>/clear_refs``), so each attack is measured alone.
Before the door, an 8 MB body without a key raised the gateway by ~150 MB
and a 60 MB one by ~850 MB; a refused body now costs at most the cap (4 MiB).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import WorkerProcess, make_settings
from services import NatsServer
from services import running as running_service

pytestmark = pytest.mark.timeout(300)

A, B = "door-a", "door-b"
KEYS = {A: "key-of-door-a-0123456789", B: "key-of-door-b-9876543210"}
MIB = 1024 * 1024
CAP = 4 * MIB  # the default http.max_body_bytes
ATTACK = 50 * MIB
GROWTH_LIMIT = 20 * MIB  # the cap and the request's own cost fit; a parsed 50 MB body does not


@dataclass
class Gateway:
    url: str
    pid: int
    log: Path

    def reset_peak(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

    def peak(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    def growth(self, attack) -> tuple[int, object]:
        """(how far the peak rose above the resident set while ``attack`` ran, its result)."""
        self.reset_peak()
        before = self.peak()
        result = attack()
        grew = self.peak() - before
        print(f"gateway peak +{grew / MIB:.1f} MiB ({getattr(result, 'status_code', '?')})")
        return grew, result


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("door")
    with running_service(NatsServer) as server:
        settings = make_settings(server.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        env = {"MEMQ_HTTP__PORT": "0", "MEMQ_HTTP__APPS": json.dumps({a: {"api_key": k} for a, k in KEYS.items()})}
        proc = WorkerProcess(settings, tmp / "http.log", kind="http", env=env).start()
        try:
            proc.wait_ready()
            url = (settings.run_dir / "http.url").read_text().strip()
            assert proc.proc is not None
            yield Gateway(url, proc.proc.pid, tmp / "http.log")
        finally:
            proc.stop()


def events_path(app: str) -> str:
    return f"/v1/apps/{app}/users/mallory/sessions/s1/events"


def key(app: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[app]}"}


def big_body(size: int) -> bytes:
    """A well-formed append of one huge event: the old gateway parsed it whole."""
    head, tail = (
        b'{"events": [{"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": "',
        b'"}]}}]}',
    )
    return head + b"x" * (size - len(head) - len(tail)) + tail


def chunks(size: int, step: int = 256 * 1024) -> Iterator[bytes]:
    body = big_body(size)
    for i in range(0, len(body), step):
        yield body[i : i + step]


def post(gateway: Gateway, path: str, headers: dict[str, str] | None = None, **kwargs) -> httpx.Response:
    with httpx.Client(base_url=gateway.url, timeout=120, headers={"Content-Type": "application/json"}) as http:
        return http.post(path, headers=headers or {}, **kwargs)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:300])
    return response.json()["error"]


TURN = {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": "hello"}]}}


def test_a_normal_request_still_works(gateway: Gateway):
    # The control: passes before and after the door.
    accepted = post(gateway, events_path(A), key(A), json={"events": [TURN] * 100})
    assert accepted.status_code == 202, accepted.text
    assert len(accepted.json()["seqs"]) == 100
    assert post(gateway, events_path(A), key(A), content=big_body(900 * 1024)).status_code == 202
    streamed = post(gateway, events_path(A), key(A), content=chunks(900 * 1024, step=64 * 1024))  # chunked
    assert streamed.status_code == 202, streamed.text
    # under the cap, an event over one message's limit: refused by the client, not the door
    near = post(gateway, events_path(A), key(A), content=big_body(CAP - 1024))
    assert "max_body_bytes" not in error_of(near, 413)["message"]


def test_an_unauthenticated_body_costs_no_memory(gateway: Gateway):
    grew, refused = gateway.growth(lambda: post(gateway, events_path(A), content=big_body(ATTACK)))
    assert error_of(refused, 401)["code"] == "unauthenticated"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert grew < GROWTH_LIMIT, f"a refused 50 MB body raised the gateway's memory by {grew / MIB:.0f} MiB"

    grew, wrong = gateway.growth(lambda: post(gateway, events_path(A), key(B), content=big_body(ATTACK)))
    error = error_of(wrong, 403)
    assert error["code"] == "not_allowed"
    assert error["message"] == f"this API key is not for app {A!r}"  # one quote each side, no owner named
    assert grew < GROWTH_LIMIT, f"a 50 MB body with another app's key raised memory by {grew / MIB:.0f} MiB"


def test_a_declared_oversized_body_is_refused_before_it_is_sent(gateway: Gateway):
    # Only the headers: the answer must come without the body being read.
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST {events_path(A)} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEYS[A]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {60 * MIB}\r\n\r\n".encode()
        )
        started = time.monotonic()
        try:
            head = sock.recv(4096)
        except TimeoutError:
            pytest.fail("the gateway waited for a 60 MB body it should refuse from its Content-Length")
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert time.monotonic() - started < 5

    grew, refused = gateway.growth(lambda: post(gateway, events_path(A), key(A), content=big_body(60 * MIB)))
    assert error_of(refused, 413)["code"] == "oversize"
    assert "max_body_bytes" in refused.json()["error"]["message"]
    assert grew < GROWTH_LIMIT, f"a refused 60 MB body raised the gateway's memory by {grew / MIB:.0f} MiB"


def test_a_streamed_body_is_cut_off_at_the_cap(gateway: Gateway):
    # A generator: chunked transfer, no Content-Length to refuse up front.
    grew, refused = gateway.growth(lambda: post(gateway, events_path(A), key(A), content=chunks(ATTACK)))
    assert "content-length" not in refused.request.headers
    assert refused.request.headers["transfer-encoding"] == "chunked"
    assert error_of(refused, 413)["code"] == "oversize"
    assert grew < GROWTH_LIMIT, f"a streamed 50 MB body raised the gateway's memory by {grew / MIB:.0f} MiB"

    # unauthenticated and streamed: refused before a chunk is read
    grew, refused = gateway.growth(lambda: post(gateway, events_path(A), content=chunks(ATTACK)))
    assert error_of(refused, 401)["code"] == "unauthenticated"
    assert grew < GROWTH_LIMIT

    # the gateway still serves
    assert post(gateway, events_path(A), key(A), json={"events": [TURN]}).status_code == 202
