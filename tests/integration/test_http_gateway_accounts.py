"""The HTTP gateway against a nats-server with memq's accounts (the config and
secrets file of `memq nats accounts`, as in test_security): each app's key
reaches NATS as that app's own user, so NATS itself fences one app's
requests off another's data, whatever the gateway does.

The workers run as the ``workers`` user; the gateway's per-app connections
use the users of ``http.accounts_file``. Who a connection is, is read from
the server (``/connz?auth=true``), not from the gateway's own settings.
"""

from __future__ import annotations

import functools
import json
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import make_settings, running
from pydantic import SecretStr
from services import HOST, NatsServer
from services import running as running_service

from memq.contracts.client import MemoryClient
from memq.contracts.errors import Forbidden
from memq.contracts.subjects import events_subject, request_subject
from memq.workers import security
from memq.workers.http.worker import HttpGateway
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.query.worker import QueryWorker
from memq.workers.settings import Settings

pytestmark = pytest.mark.timeout(180)

A, B = "app-a", "team.b"  # B's id is escaped in subjects and in its user name
KEYS = {A: "key-of-a-0123456789", B: "key-of-b-9876543210"}
VIOLATION = "(?i)permissions violation"


@dataclass
class Gateway:
    server: NatsServer
    settings: Settings
    gateway: HttpGateway
    http: httpx.AsyncClient
    secrets: dict


def path(app: str, rest: str = "") -> str:
    return f"/v1/apps/{app}/users/alice{rest}"


def key(app: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[app]}"}


def turn(text: str) -> dict:
    return {"author": "user", "message": {"role": "user", "parts": [{"type": "text", "text": text}]}}


def texts(history: httpx.Response) -> list[str]:
    assert history.status_code == 200, history.text
    return [e["event"]["message"]["parts"][0]["text"] for e in history.json()["events"]]


def gateway_settings(base: Settings, http: dict) -> Settings:
    return base.model_copy(update={"http": base.http.model_validate({"port": 0, **http})})


async def connection_users(server: NatsServer) -> dict[str, str]:
    """Connection name -> the user the server authorized it as."""
    async with httpx.AsyncClient() as monitor:
        connz = await monitor.get(f"http://{HOST}:{server.monitor_port}/connz", params={"auth": "true"})
    connz.raise_for_status()
    return {c.get("name", ""): c.get("authorized_user", "") for c in connz.json()["connections"]}


@pytest.fixture(scope="module")
async def secured_gateway(tmp_path_factory):
    apps = [A, B]
    plain, hashed = security.generate_passwords(security.user_names(apps))
    memq_users, system_users = security.build_users(apps, hashed)
    tmp: Path = tmp_path_factory.mktemp("gateway-accounts")
    secrets = security.credentials_document(memq_users, system_users, plain, hashed)
    accounts_file = tmp / "nats-secrets.json"  # what `memq nats accounts` writes
    accounts_file.write_text(json.dumps(secrets))
    config = security.render_accounts(memq_users, system_users)
    with running_service(functools.partial(NatsServer, config=config)) as server:
        s = make_settings(server.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        s.nats = s.nats.model_copy(update={"user": "workers", "password": SecretStr(plain["workers"])})
        s = gateway_settings(
            s, {"apps": {app: {"api_key": k} for app, k in KEYS.items()}, "accounts_file": str(accounts_file)}
        )
        async with AsyncExitStack() as stack:
            for worker in (PersistenceWorker(s), QueryWorker(s)):
                await stack.enter_async_context(running(worker))
            gateway = await stack.enter_async_context(running(HttpGateway(s)))
            http = await stack.enter_async_context(httpx.AsyncClient(base_url=gateway.url, timeout=30))
            yield Gateway(server, s, gateway, http, secrets)


async def test_each_apps_requests_reach_nats_as_that_apps_own_user(secured_gateway):
    g = secured_gateway
    users = await connection_users(g.server)
    prefix = g.settings.nats.name
    assert users[f"{prefix}-http-{A}"] == security.app_user_name(A) == "app-app-a"
    assert users[f"{prefix}-http-{B}"] == security.app_user_name(B)
    assert security.app_user_name(B) != B  # the escaped name, read from the secrets file
    # the process's own connection (the workers' identity) serves no app's request
    clients = g.gateway.live.clients
    assert clients is not None and g.gateway.nc is not None
    assert all(clients.get(app).nc is not g.gateway.nc for app in (A, B))
    assert clients.get(A).nc is not clients.get(B).nc
    # on its own user, an app's reads still see every write acknowledged before them, as on the shared connection
    assert clients.get(A).consistency == clients.get(B).consistency == "any"


async def test_a_works_end_to_end_over_http_on_its_own_user(secured_gateway):
    http = secured_gateway.http
    created = await http.post(path(A, "/sessions"), json={"session_id": "trip"}, headers=key(A))
    assert created.status_code == 201, created.text
    appended = await http.post(
        path(A, "/sessions/trip/events"),
        json={"events": [turn("Lisbon on May 3rd"), turn("window seat please")]},
        headers=key(A),
    )
    assert appended.status_code == 202, appended.text
    seq = appended.json()["seq"]
    history = await http.get(
        path(A, "/sessions/trip/history"), params={"min_seq": seq, "strategy": "all"}, headers=key(A)
    )
    assert texts(history) == ["Lisbon on May 3rd", "window seat please"]


async def test_as_connection_is_refused_bs_subjects_by_nats(secured_gateway):
    g = secured_gateway
    http = g.http
    created = await http.post(path(B, "/sessions"), json={"session_id": "plans"}, headers=key(B))
    assert created.status_code == 201, created.text
    mine = await http.post(path(B, "/sessions/plans/events"), json={"events": [turn("b's plan")]}, headers=key(B))
    seq = mine.json()["seq"]

    # The gateway's connection for A, used for B's subjects: NATS refuses it,
    # so even a gateway bug that picked the wrong client could not leak or write.
    clients = g.gateway.live.clients
    assert clients is not None
    as_b_on_a = MemoryClient(clients.get(A).nc, B, timeout=1.0, consistent=False, wait_ms=0)
    with pytest.raises(Forbidden, match=VIOLATION) as read:
        await as_b_on_a.history("alice", "plans")
    # nats-py lower-cases the server's error, and B's subject token has capitals (~2E)
    assert f'"{request_subject(B, "history")}"'.lower() in str(read.value).lower()
    with pytest.raises(Forbidden, match=VIOLATION) as write:
        await as_b_on_a.append_text("alice", "plans", "user", "written by A's user")
    assert f'"{events_subject(B, "alice", "plans")}"'.lower() in str(write.value).lower()

    history = await http.get(path(B, "/sessions/plans/history"), params={"min_seq": seq}, headers=key(B))
    assert texts(history) == ["b's plan"]


async def test_as_key_on_bs_paths_is_403_and_bs_data_is_untouched(secured_gateway):
    http = secured_gateway.http
    created = await http.post(path(B, "/sessions"), json={"session_id": "diary"}, headers=key(B))
    assert created.status_code == 201, created.text
    mine = await http.post(path(B, "/sessions/diary/events"), json={"events": [turn("b's secret")]}, headers=key(B))
    seq = mine.json()["seq"]

    for method, rest, body in (
        ("GET", "/sessions/diary", None),
        ("GET", "/sessions/diary/history", None),
        ("GET", "/sessions", None),
        ("POST", "/sessions/diary/events", {"events": [turn("a was here")]}),
        ("PATCH", "/sessions/diary/state", {"set": {"owner": "a"}}),
        ("DELETE", "/sessions/diary", None),
    ):
        refused = await http.request(method, path(B, rest), json=body, headers=key(A))
        assert refused.status_code == 403, (method, rest, refused.text)
        assert refused.json()["error"]["code"] == "not_allowed"

    history = await http.get(path(B, "/sessions/diary/history"), params={"min_seq": seq}, headers=key(B))
    assert texts(history) == ["b's secret"]
    session = await http.get(path(B, "/sessions/diary"), params={"min_seq": seq}, headers=key(B))
    assert session.status_code == 200 and session.json()["state"] == {}
    # ...and A's own paths never held it
    missing = await http.get(path(A, "/sessions/diary"), params={"min_seq": seq}, headers=key(A))
    assert missing.status_code == 404, missing.text


async def test_a_password_in_the_apps_settings_picks_its_user_too(secured_gateway):
    """``http.apps.<app>.nats_password`` without an accounts file: the same
    per-app user; an app with neither shares the process's connection."""
    g = secured_gateway
    user = security.app_user_name(A)
    password = g.secrets["users"][user]["password"]
    s = gateway_settings(
        g.settings,
        {"apps": {A: {"api_key": KEYS[A], "nats_password": password}, B: {"api_key": KEYS[B]}}},
    )
    async with running(HttpGateway(s)) as gateway, httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        clients = gateway.live.clients
        assert clients is not None
        a_nc, b_nc = clients.get(A).nc, clients.get(B).nc
        assert a_nc is not gateway.nc and b_nc is gateway.nc
        users = await connection_users(g.server)
        assert users[f"{s.nats.name}-http-{A}"] == user
        created = await http.post(path(A, "/sessions"), json={"session_id": "pw"}, headers=key(A))
        assert created.status_code == 201, created.text
        history = await http.get(
            path(A, "/sessions/pw/history"), params={"min_seq": created.json()["seq"]}, headers=key(A)
        )
        assert texts(history) == []


async def test_a_wrong_password_fails_the_gateways_start(secured_gateway):
    g = secured_gateway
    s = gateway_settings(g.settings, {"apps": {A: {"api_key": KEYS[A], "nats_password": "not-a's-password"}}})
    with pytest.raises(Exception, match="(?i)authorization"):
        async with running(HttpGateway(s)):
            pass


async def test_an_accounts_file_without_the_app_fails_the_gateways_start(secured_gateway, tmp_path):
    g = secured_gateway
    only_b = {**g.secrets, "users": {k: v for k, v in g.secrets["users"].items() if v.get("app") != A}}
    (tmp_path / "secrets.json").write_text(json.dumps(only_b))
    s = gateway_settings(
        g.settings,
        {"apps": {app: {"api_key": k} for app, k in KEYS.items()}, "accounts_file": str(tmp_path / "secrets.json")},
    )
    with pytest.raises(ValueError, match=f"app {A!r} has an API key but no user"):
        async with running(HttpGateway(s)):
            pass
