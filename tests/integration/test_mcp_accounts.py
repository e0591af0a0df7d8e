"""`memq mcp` against a nats-server with memq's accounts (as the gateway in
test_http_gateway_accounts): the server's tool calls reach NATS as its app's
own user (from ``http.accounts_file``), so NATS itself fences it, and the
tools work on that user."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from services import HOST
from test_http_gateway_accounts import KEYS, A, secured_gateway  # noqa: F401 - a fixture
from test_mcp import MEMQ, call

from memq.workers import security

pytestmark = pytest.mark.timeout(180)


async def test_the_stdio_server_talks_to_nats_as_its_apps_own_user(secured_gateway, tmp_path):  # noqa: F811
    g = secured_gateway
    nats = g.settings.nats
    assert nats.password is not None and g.settings.http.accounts_file is not None
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")},
        "MEMQ_DATA_DIR": str(tmp_path),
        "MEMQ_LOG_LEVEL": "WARNING",
        "MEMQ_NATS__URL": g.server.url,
        "MEMQ_NATS__USER": "workers",
        "MEMQ_NATS__PASSWORD": nats.password.get_secret_value(),
        "MEMQ_HTTP__APPS": json.dumps({app: {"api_key": k} for app, k in KEYS.items()}),
        "MEMQ_HTTP__ACCOUNTS_FILE": str(g.settings.http.accounts_file),
    }
    server = StdioServerParameters(command=MEMQ, args=["mcp", "--app", A, "--user", "mcp-user"], env=env)
    async with Client(server, read_timeout_seconds=60) as mcp:
        await call(mcp, "remember", session="own-user", text="remembered through the app's own NATS user")
        sessions = await call(mcp, "list_sessions")
        assert [s["session"] for s in sessions["sessions"]] == ["own-user"]
        names = await connection_names(g.server)
    # the app's own connection, and no other app's: the server connects only its app's user
    assert names.count((f"{nats.name}-mcp-{A}", security.app_user_name(A))) == 1
    assert [n for n in names if n[0].startswith(f"{nats.name}-mcp-")] == [(f"{nats.name}-mcp-{A}", "app-app-a")]
    assert (f"{nats.name}-mcp", "workers") in names  # the process's own, which serves no app's call here


async def connection_names(server) -> list[tuple[str, str]]:
    """(connection name, the user the server authorized it as), every connection."""
    async with httpx.AsyncClient() as monitor:
        connz = await monitor.get(f"http://{HOST}:{server.monitor_port}/connz", params={"auth": "true"})
    connz.raise_for_status()
    return [(c.get("name", ""), c.get("authorized_user", "")) for c in connz.json()["connections"]]
