"""No error a client can provoke names the server's files (issue 32: a search
error sent the path of the embedded index to the client).

A real stack (NATS, SQLite, the persistence and query workers, the HTTP
gateway) whose data directory, SQLite file and embedded index are all under
``tmp_path``; the client sends what an outsider can: bad ids, bad cursors,
bad bodies, reads of what does not exist, searches of a broken index. Every
error message it gets back is searched for the data directory."""

from __future__ import annotations

import httpx
import pytest
from helpers import make_settings, running, running_query, running_worker

from memq.workers.http.worker import HttpGateway
from memq.workers.settings import Settings

pytestmark = pytest.mark.timeout(300)

KEY = "key-of-detail-0123456789"
APP = "detail"
AUTH = {"Authorization": f"Bearer {KEY}"}


def settings_for(nats_url: str, sqlite_url: str, tmp_path) -> Settings:
    base = make_settings(nats_url, sqlite_url, tmp_path)
    return base.model_copy(update={"http": base.http.model_validate({"port": 0, "apps": {APP: {"api_key": KEY}}})})


def provocations(base: str) -> list[tuple[str, str, dict]]:
    """(method, path, httpx keyword arguments) of requests that fail."""
    long_id = "u" * 10_000
    return [
        ("GET", f"{base}/search", {"params": {"q": "where is the data?"}}),  # the broken index
        ("GET", f"{base}/search", {"params": {"q": "x", "mode": "vector", "min_seq": 1}}),
        ("GET", f"{base}/search", {"params": {"q": "x", "k": 0}}),
        ("GET", f"{base}/search", {"params": {"q": "x", "since": "yesterday"}}),
        ("GET", f"{base}/sessions/nope/history", {}),
        ("GET", f"{base}/sessions/nope/context", {}),
        ("GET", f"{base}/sessions/nope/state", {}),
        ("GET", f"{base}/sessions", {"params": {"cursor": "../../etc/passwd"}}),
        ("GET", f"{base}/sessions", {"params": {"cursor": "eyJ4IjogMX0="}}),
        ("GET", f"/v1/apps/{APP}/users/{long_id}/sessions", {}),
        ("POST", f"{base}/sessions", {"content": b"{not json"}),
        ("POST", f"{base}/sessions/s1/events", {"json": {"events": [{"message": {"role": "nobody"}}]}}),
        ("GET", f"{base}/sessions/s1/history", {"params": {"min_seq": 10**12, "wait_ms": 10}}),
        ("GET", f"{base}/sessions/s1/context", {"params": {"strategy": "nonsense"}}),
        ("GET", "/v1/apps/other/users/u/sessions", {}),
        ("GET", "/nothing/here", {}),
    ]


async def test_no_error_a_client_can_provoke_names_the_data_directory(nats_url, sqlite_url, tmp_path):
    settings = settings_for(nats_url, sqlite_url, tmp_path)
    settings.index_path().parent.mkdir(parents=True, exist_ok=True)
    settings.index_path().write_bytes(b"not an index, not even SQLite" * 100)  # every search fails opening it
    secrets = {str(tmp_path), str(tmp_path.resolve()), settings.index_path().name, "memq.db"}
    async with (
        running_worker(settings),
        running_query(settings),
        running(HttpGateway(settings)) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=30, headers=AUTH) as http,
    ):
        base = f"/v1/apps/{APP}/users/alice"
        created = await http.post(f"{base}/sessions", json={"session_id": "s1"})
        assert created.status_code == 201, created.text
        messages = []
        for method, path, kw in provocations(base):
            r = await http.request(method, path, **kw)
            assert r.status_code >= 400, (method, path[:80], r.status_code, r.text[:200])
            messages.append((path[:80], r.status_code, r.text))
        leaked = [(p, s, t) for p, s, t in messages if any(secret in t for secret in secrets)]
        assert not leaked, leaked
        # the broken index was refused as unavailable, not answered
        assert messages[0][1] == 503 and "the index is unavailable" in messages[0][2]
