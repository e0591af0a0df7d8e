"""What a body costs the HTTP gateway and `memq mcp --transport http` before
it is refused (issue 38, findings 7 and 8), against real processes: a
`memq worker http` with a key per app in front of real persistence and query
workers, and a `memq mcp` server.

- Off the app paths, a keyless request was read whole (up to 4 MiB, with
  no deadline) before its 404: ten such connections raised the gateway by
  ~48 MB and were held as long as their senders liked. Now every path wants
  a key before the body, and a request must arrive within
  ``http.read_timeout_s``.
- With its own key, A's 4 MiB ``{"events":[{},{},…]}`` was parsed whole (1.4
  million dicts, +100 MB) before its 422, and a burst of them stalled B's
  reads on the gateway's loop (7 ms -> 311 ms median). Now the body's JSON is
  counted as it arrives and refused at ``http.max_json_elements``.

Memory is the server process's peak resident set (``VmHWM``), reset before
each attack (``/proc/<pid>/clear_refs``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import WorkerProcess, make_settings, mcp_http
from services import NatsServer
from services import running as running_service

from memq.workers.settings import Settings

pytestmark = pytest.mark.timeout(600)

A, B = "bodies-a", "bodies-b"
KEYS = {A: "key-of-bodies-a-0123456789", B: "key-of-bodies-b-9876543210"}
MIB = 1024 * 1024
NEAR_CAP = 4 * MIB - 1  # just under the default http.max_body_bytes
READ_TIMEOUT_S = 3.0  # http.read_timeout_s of these servers (default 30 s: too long to wait for here)
GROWTH_LIMIT = 20 * MIB  # a request's own cost and some chunks fit; ten 4 MiB bodies read whole do not
TURN = {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": "hello"}]}}


def empties(size: int) -> bytes:
    """A 4 MiB append of ~1.4 million empty events: each a dict once parsed."""
    head, tail = b'{"events":[', b"{}]}"
    return head + b"{}," * ((size - len(head) - len(tail)) // 3) + tail


@dataclass
class Server:
    """A server process: where it listens, and its memory."""

    url: str
    pid: int

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
        return host, int(port)

    def growth(self, attack: Callable[[], object]) -> tuple[int, object]:
        """(how far the peak rose above the resident set while ``attack`` ran, its result)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = self.peak()
        result = attack()
        grew = self.peak() - before
        print(f"peak +{grew / MIB:.1f} MiB")
        return grew, result

    def peak(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")


def env_of(settings: Settings) -> dict[str, str]:
    return {
        "MEMQ_HTTP__PORT": "0",
        "MEMQ_HTTP__APPS": json.dumps({a: {"api_key": k} for a, k in KEYS.items()}),
        "MEMQ_HTTP__READ_TIMEOUT_S": str(READ_TIMEOUT_S),
        "MEMQ_CACHE__BACKEND": "none",  # B's reads are computed, as most are
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Settings, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("bodies")
    with running_service(NatsServer) as nats:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        env = env_of(settings)
        workers = [WorkerProcess(settings, tmp / f"{k}.log", kind=k, env=env).start() for k in ("persistence", "query")]
        try:
            for worker in workers:
                worker.wait_ready()
            yield settings, env
        finally:
            for worker in workers:
                worker.stop()


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory) -> Iterator[Server]:
    settings, env = stack
    proc = WorkerProcess(settings, tmp_path_factory.mktemp("gw") / "http.log", kind="http", env=env).start()
    try:
        proc.wait_ready()
        assert proc.proc is not None
        yield Server((settings.run_dir / "http.url").read_text().strip(), proc.proc.pid)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def mcp(stack) -> Iterator[Server]:
    """`memq mcp --transport http` for app A, its URL from its ready line."""
    settings, env = stack
    full = WorkerProcess(settings, Path(os.devnull), env=env).env  # os.environ, the settings, env
    with mcp_http(full, A) as (url, proc):
        yield Server(url, proc.pid)


def key(app: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[app]}"}


def head(method: str, path: str, host: str, length: int, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer_of(sock: socket.socket) -> bytes:
    """The server's whole answer (head and ``Content-Length`` body); what
    came of it when the socket's timeout passed or the server closed."""
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            if not (data := sock.recv(65536)):
                return answer
            answer += data
        length = re.search(rb"(?i)content-length: (\d+)", answer.split(b"\r\n\r\n", 1)[0])
        while length and len(answer.split(b"\r\n\r\n", 1)[1]) < int(length[1]):
            if not (data := sock.recv(65536)):
                break
            answer += data
    except (TimeoutError, ConnectionResetError):
        pass
    return answer


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (what it sends meanwhile is
    dropped), or None if it was still open after ``seconds``."""
    started = time.monotonic()
    sock.settimeout(0.5)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - started
    return None


# -- finding 7: keyless bodies, stalled requests ---------------------------------------------------


def test_keyless_bodies_off_the_app_paths_are_answered_unread_and_closed(gateway: Server):
    host, port = gateway.address
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(10)]
    try:
        # Only the headers: the answer must come without a byte of the body.
        for sock in socks:
            sock.sendall(head("POST", "/anything", f"{host}:{port}", NEAR_CAP))
        answers = [answer_of(sock) for sock in socks]
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 401"), f"no answer before the body was sent: {answer[:120]!r}"
            assert b'"unauthenticated"' in answer

        # The bodies, sent anyway, all at once: the gateway holds none of them.
        body = b"x" * NEAR_CAP

        def send_all() -> None:
            with ThreadPoolExecutor(len(socks)) as pool:
                list(pool.map(lambda s: s.sendall(body), socks))

        grew, _ = gateway.growth(send_all)
        assert grew < GROWTH_LIMIT, f"ten refused 4 MiB bodies raised the gateway by {grew / MIB:.0f} MiB"
    finally:
        for sock in socks:
            sock.close()

    # Refused connections that keep their body back are closed by the read deadline.
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(5)]
    try:
        for sock in socks:
            sock.sendall(head("PUT", "/v2/whatever", f"{host}:{port}", NEAR_CAP) + b"x" * 1000)
        assert all(answer_of(sock).startswith(b"HTTP/1.1 401") for sock in socks)
        held = [closed_within(sock, READ_TIMEOUT_S + 10) for sock in socks]
        assert all(t is not None for t in held), f"refused connections still open {READ_TIMEOUT_S + 10}s on: {held}"
    finally:
        for sock in socks:
            sock.close()

    # A key makes an unknown path a 404; the API's documents need none and read no body.
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        assert http.post("/anything", headers=key(A), json={}).json()["error"]["code"] == "not_found"
        assert http.get("/openapi.json").status_code == 200
        assert http.get("/docs").status_code == 200
        refused = http.get("/anything")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"


def test_a_request_that_stalls_is_closed_within_the_read_timeout(gateway: Server):
    host, port = gateway.address
    bound = READ_TIMEOUT_S + 5  # the deadline plus a loaded VM's scheduling
    with (
        socket.create_connection((host, port), timeout=10) as stalled_body,
        socket.create_connection((host, port), timeout=10) as stalled_headers,
        socket.create_connection((host, port), timeout=10) as silent,
    ):
        started = time.monotonic()
        path = f"/v1/apps/{A}/users/u/sessions/s/events"
        stalled_body.sendall(head("POST", path, f"{host}:{port}", 1000, key(A)) + b'{"events": [')  # then nothing
        stalled_headers.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n".encode())  # half the headers

        # a slow-loris trickle: a header line every half second, the head never ending
        trickled = socket.create_connection((host, port), timeout=10)
        stop = threading.Event()

        def trickle() -> None:
            try:
                trickled.sendall(f"GET /openapi.json HTTP/1.1\r\nHost: {host}\r\n".encode())
                for i in range(int(bound * 4)):
                    if stop.wait(0.5):
                        return
                    trickled.sendall(f"X-Slow-{i}: {i}\r\n".encode())
            except OSError:
                return  # closed by the gateway: what the test waits for

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            stalled_body.settimeout(bound)
            answer = answer_of(stalled_body)
            assert answer.startswith(b"HTTP/1.1 408"), f"a stalled body got {answer[:80]!r} in {bound}s"
            waited = {
                "body": closed_within(stalled_body, bound),
                "headers": closed_within(stalled_headers, bound),
                "silent": closed_within(silent, bound),
                "trickle": closed_within(trickled, bound),
            }
            open_ones = [name for name, t in waited.items() if t is None]
            assert not open_ones, f"still open {time.monotonic() - started:.0f}s on: {open_ones}"
            assert time.monotonic() - started < 2 * bound
        finally:
            stop.set()
            sender.join()
            trickled.close()

    # a request that arrives in time is served, on a fresh connection as on a kept one
    with httpx.Client(base_url=gateway.url, timeout=30, headers=key(A)) as http:
        for _ in range(2):
            assert http.post(f"/v1/apps/{A}/users/u/sessions/s/events", json={"events": [TURN]}).status_code == 202


# -- finding 8: JSON amplification with one's own key ----------------------------------------------


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def within(attacked: float, idle: float, slack: float) -> bool:
    # The target is 2x. On this loaded 2-core VM the attacker's
    # process, the gateway's receiving of 4 MiB bodies and the other tests'
    # processes share the CPUs with B whatever the gateway does, so a fixed
    # slack is allowed where 2x of a few ms is below that noise: 50 ms on the
    # median, 150 ms on the p99 (one scheduling hiccup of the VM is ~100 ms).
    # Measured here: idle 4 ms / 8 ms, under the burst 4 ms / 13-16 ms; before
    # the budget 120-145 ms / 640-730 ms (MCP's p99: 4.1-4.7 s).
    return attacked <= max(2 * idle, idle + slack)


def reads_during(read: Callable[[], None], attack: Callable[[], list[str]] | None) -> tuple[list[float], list[str]]:
    """B's read latencies: 200 of them, or as many as fit while ``attack``
    runs; and what the attack got."""
    samples: list[float] = []
    got: list[str] = []
    attacker = threading.Thread(target=lambda: got.extend(attack())) if attack is not None else None
    if attacker is not None:
        attacker.start()
    while attacker.is_alive() if attacker is not None else len(samples) < 200:
        started = time.perf_counter()
        read()
        samples.append(time.perf_counter() - started)
    if attacker is not None:
        attacker.join()
    return samples, got


# A's burst runs in a process of its own, on raw sockets: in the test's
# process its threads would take the GIL from B's reads and measure the test.
# It is paced (10 bodies a second, 4 at a time): at full speed the loopback
# copy of 4 MiB bodies alone fills both cores of this VM, with or without any
# parsing, and B would measure that. 10 a second is ~1.5 s of parsing a
# second on the old gateway's loop, and ~0.06 s of counting on the new one.
def burst(
    server: Server,
    path: str,
    body: bytes,
    headers: dict[str, str],
    total: int = 40,
    parallel: int = 4,
    rate: float = 10,
):
    """A run of ``total`` posts of ``body`` to ``path``, ``parallel`` at a time
    and ``rate`` a second, from another process; returns the statuses it got."""
    host, port = server.address
    request = head("POST", path, f"{host}:{port}", len(body), headers) + body
    script = textwrap.dedent(
        f"""
        import socket, sys, time
        from concurrent.futures import ThreadPoolExecutor
        request = sys.stdin.buffer.read()
        start = time.monotonic()

        def one(i):
            time.sleep(max(0.0, start + i / {rate} - time.monotonic()))
            with socket.create_connection(({host!r}, {port}), timeout=120) as sock:
                try:
                    sock.sendall(request)
                except OSError:
                    pass  # closed once answered: the answer is still read
                answer = b""
                while b"\\r\\n" not in answer and (data := sock.recv(4096)):
                    answer += data
                return answer.split(b" ", 2)[1].decode() if answer else "none"

        with ThreadPoolExecutor({parallel}) as pool:
            print(" ".join(pool.map(one, range({total}))))
        """
    )

    def run() -> list[str]:
        done = subprocess.run([sys.executable, "-c", script], input=request, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return done.stdout.decode().split()

    return run


def test_a_body_of_a_million_empty_events_is_refused_fast_and_b_reads_on(gateway: Server):
    body = empties(NEAR_CAP)
    events = f"/v1/apps/{A}/users/mallory/sessions/s/events"
    with httpx.Client(base_url=gateway.url, timeout=120, headers={"Content-Type": "application/json"}) as http:
        started = time.monotonic()
        grew, refused = gateway.growth(lambda: http.post(events, headers=key(A), content=body))
        elapsed = time.monotonic() - started
    assert isinstance(refused, httpx.Response)
    assert refused.status_code == 413, (refused.status_code, refused.text[:300])
    error = refused.json()["error"]
    assert error["code"] == "oversize" and "http.max_json_elements" in error["message"], error
    assert grew < GROWTH_LIMIT, f"a 4 MiB body of empty events raised the gateway by {grew / MIB:.0f} MiB"
    assert elapsed < 5, f"refused after {elapsed:.1f}s"

    # B's reads, idle and while A sends 40 of those bodies, 4 at a time.
    b = f"/v1/apps/{B}/users/bob/sessions/chat"
    with httpx.Client(base_url=gateway.url, timeout=60, headers=key(B)) as reader:
        seq = reader.post(f"{b}/events", json={"events": [TURN] * 5}).json()["seq"]
        assert reader.get(b, params={"min_seq": seq}).status_code == 200

        def read() -> None:
            assert reader.get(f"{b}/history").status_code == 200

        attack = burst(gateway, events, body, key(A))
        idle, _ = reads_during(read, None)
        grew, (attacked, got) = gateway.growth(lambda: reads_during(read, attack))
    assert got == ["413"] * 40, got
    (idle_median, idle_p99), (median, p99) = percentiles(idle), percentiles(attacked)
    print(f"B idle median {idle_median * 1000:.1f} ms p99 {idle_p99 * 1000:.1f} ms; under attack "
          f"median {median * 1000:.1f} ms p99 {p99 * 1000:.1f} ms ({len(attacked)} reads)")  # fmt: skip
    assert len(attacked) >= 5, "too few reads during the burst to judge"
    assert within(median, idle_median, 0.05), (
        f"B's median read {median * 1000:.0f} ms vs {idle_median * 1000:.0f} ms idle"
    )
    assert within(p99, idle_p99, 0.15), f"B's p99 read {p99 * 1000:.0f} ms vs {idle_p99 * 1000:.0f} ms idle"
    assert grew < 4 * GROWTH_LIMIT, f"40 such bodies, 4 at a time, raised the gateway by {grew / MIB:.0f} MiB"


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def test_mcp_over_http_refuses_a_batch_of_a_million_empty_objects_fast(mcp: Server):
    body = b"[" + b"{}," * ((NEAR_CAP - 5) // 3) + b"{}]"  # a JSON-RPC batch of empty messages
    headers = {**MCP_HEADERS, **key(A)}
    with httpx.Client(timeout=120, headers=headers) as http:
        started = time.monotonic()
        grew, refused = mcp.growth(lambda: http.post(mcp.url, content=body))
        elapsed = time.monotonic() - started
    assert isinstance(refused, httpx.Response)
    assert refused.status_code == 413, (refused.status_code, refused.text[:300])
    assert "http.max_json_elements" in refused.json()["error"]["message"]
    assert grew < GROWTH_LIMIT, f"a 4 MiB batch of empty objects raised memq mcp by {grew / MIB:.0f} MiB"
    assert elapsed < 5, f"refused after {elapsed:.1f}s"

    # One server serves one app, so the one stalled would be the app's other
    # callers: a cheap call (tools/list, no NATS) is timed idle and during a burst.
    with httpx.Client(timeout=60, headers=headers) as other:

        def read() -> None:
            listed = other.post(mcp.url, json=TOOLS_LIST)
            assert listed.status_code == 200 and listed.json()["result"]["tools"], listed.text[:200]

        idle, _ = reads_during(read, None)
        attacked, got = reads_during(read, burst(mcp, "/mcp", body, headers))
    assert got == ["413"] * 40, got
    (idle_median, idle_p99), (median, p99) = percentiles(idle), percentiles(attacked)
    print(f"tools/list idle median {idle_median * 1000:.1f} ms p99 {idle_p99 * 1000:.1f} ms; under attack "
          f"median {median * 1000:.1f} ms p99 {p99 * 1000:.1f} ms ({len(attacked)} calls)")  # fmt: skip
    assert len(attacked) >= 5
    assert within(median, idle_median, 0.05), f"median {median * 1000:.0f} ms vs {idle_median * 1000:.0f} ms idle"
    assert within(p99, idle_p99, 0.15), f"p99 {p99 * 1000:.0f} ms vs {idle_p99 * 1000:.0f} ms idle"


def test_mcp_over_http_closes_a_stalled_request(mcp: Server):
    host, port = mcp.address
    with socket.create_connection((host, port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(head("POST", "/mcp", f"{host}:{port}", 1000, {**MCP_HEADERS, **key(A)}) + b'{"jsonrpc": ')
        sock.settimeout(READ_TIMEOUT_S + 5)
        answer = answer_of(sock)
        assert answer.startswith(b"HTTP/1.1 408"), f"a stalled body got {answer[:80]!r}"
        assert closed_within(sock, READ_TIMEOUT_S + 5) is not None
        assert time.monotonic() - started < 2 * (READ_TIMEOUT_S + 5)
