"""The agent outside the containers: memq's own MemoryClient over the published
NATS ports (TLS, the app's user), and the HTTP gateway with the app's key.

:func:`client_check` is the check every stack passes (Compose, kube play);
:class:`Steady` is the client of the fault run and the rolling upgrade: it
appends and reads at a steady pace, keeps every acknowledged sequence and
every failure with its time, so that SQL can be counted against it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from podctl import Failed, say

from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError


def tls(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def connect(urls: list[str], ca: Path, app: str, password: str) -> MemoryClient:
    return await MemoryClient.connect(
        urls,
        app=app,
        user=f"app-{app}",
        password=password,
        tls=tls(ca),
        max_reconnect_attempts=-1,  # a long-running agent: wait out a node's restart
        wait_ms=5000,
    )


def http_get(url: str, key: str | None, timeout: float = 10) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"X-API-Key": key} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


async def client_check(urls: list[str], ca: Path, app: str, password: str, http: str, key: str) -> dict[str, object]:
    """Append, read with read-your-writes, search, and the gateway with the app's key."""
    started = time.monotonic()
    client = await connect(urls, ca, app, password)
    try:
        user, session = "deploy-check", f"s-{uuid.uuid4().hex[:12]}"
        word = f"zebra{uuid.uuid4().hex[:8]}"
        seqs = [
            await client.append_text(user, session, "user", f"the {word} crossed the road, message {i}")
            for i in range(5)
        ]
        view = await client.get_session(user, session, events=True)  # carries last_seq: read-your-writes
        got = [e.seq for e in view.events or []]
        if got != seqs:
            raise Failed(f"read-your-writes: appended {seqs}, the session read back {got}")
        found = await client.search(user, word, mode="keyword", k=10)  # waits until indexed (min_seq)
        if len(found.results) != 5:
            raise Failed(f"search for {word!r} found {len(found.results)} of 5 events (mode {found.mode})")
        vector = await client.search(user, "a zebra crossed a road", mode="vector", k=3, session=session)
        if not vector.results:
            raise Failed("vector search found nothing")
    finally:
        await client.close()
    code, body = await asyncio.to_thread(http_get, f"{http}/v1/apps/{app}/users/{user}/sessions", key)
    ids = [s.get("session") for s in body.get("sessions", [])]
    if code != 200 or session not in ids:
        raise Failed(f"HTTP gateway with the app's key: {code}, sessions {ids}")
    refused, _ = await asyncio.to_thread(http_get, f"{http}/v1/apps/{app}/users/{user}/sessions", None)
    if refused != 401:
        raise Failed(f"HTTP gateway without a key answered {refused}, not 401")
    result = {
        "appended": len(seqs),
        "read_back": len(got),
        "keyword_hits": 5,
        "vector_hits": len(vector.results),
        "http": code,
        "http_no_key": refused,
        "s": round(time.monotonic() - started, 1),
    }
    say(f"client check passed: {result}")
    return result


@dataclass
class Steady:
    """Appends (one every `interval` s) and a read-your-writes read after each,
    until stopped; what was acknowledged and what failed, with times."""

    client: MemoryClient
    user: str = "steady"
    interval: float = 0.1
    acked: dict[int, str] = field(default_factory=dict)  # seq -> text
    unknown: list[str] = field(default_factory=list)  # texts whose publish raised (maybe stored)
    failures: list[tuple[float, str, str]] = field(default_factory=list)  # (t, op, error)
    ok_reads: list[float] = field(default_factory=list)  # when each read succeeded
    stopping: bool = False
    sessions: list[str] = field(default_factory=list)

    async def run(self) -> None:
        n = 0
        while not self.stopping:
            if n % 25 == 0:
                self.sessions.append(f"s-{uuid.uuid4().hex[:12]}")
            session, text = self.sessions[-1], f"steady {uuid.uuid4().hex} #{n}"
            n += 1
            try:
                seq = await self.client.append_text(self.user, session, "user", text)
                self.acked[seq] = text
            except MemqError as exc:
                self.unknown.append(text)
                self.failures.append((time.monotonic(), "append", f"{type(exc).__name__}: {exc}"[:160]))
                await asyncio.sleep(self.interval)
                continue
            try:
                view = await self.client.get_session(self.user, session, events=True, after_seq=seq - 1)
                if seq not in [e.seq for e in view.events or []]:
                    raise Failed(f"read-your-writes: seq {seq} missing from the read after it")
                self.ok_reads.append(time.monotonic())
            except (TimeoutError, MemqError) as exc:
                self.failures.append((time.monotonic(), "read", f"{type(exc).__name__}: {exc}"[:160]))
            await asyncio.sleep(self.interval)

    @property
    def reads_ok(self) -> int:
        return len(self.ok_reads)

    async def recovered(self, since: float, timeout: float = 120) -> float:
        """Seconds from `since` until the first read that succeeded after it."""
        deadline = time.monotonic() + timeout
        while not self.ok_reads or self.ok_reads[-1] <= since:
            if time.monotonic() > deadline:
                raise Failed(f"reads did not recover within {timeout:.0f} s; last failures: {self.failures[-3:]}")
            await asyncio.sleep(0.2)
        return next(t for t in self.ok_reads if t > since) - since

    def longest_read_gap(self, start: float, end: float) -> float:
        """The longest time within [start, end] without a successful read."""
        times = [start, *(t for t in self.ok_reads if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))
