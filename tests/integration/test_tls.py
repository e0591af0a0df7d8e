"""TLS and credentials on every connection, against real servers: NATS (TLS
with client certificates), PostgreSQL (ssl=on, scram passwords), Redis
(--tls-port, requirepass, client certificates) and Weaviate (API keys).

Certificates come from a throwaway CA (trustme). For each connection: the
right settings work, and a wrong CA or a wrong password fails with an error
that says so and does not contain the password.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from pydantic import SecretStr
from services import NatsServer, Postgres, Redis, Weaviate, free_port
from services import running as running_service
from sqlalchemy import text

from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.index.backends.weaviate import WeaviateIndex
from memq.workers.query.cache import RedisBackend
from memq.workers.runtime import bus
from memq.workers.settings import Settings, TLSSettings, WeaviateSettings
from memq.workers.sql.engine import create_engine, migrate

pytestmark = pytest.mark.timeout(180)

PASSWORD = "tls-test-Pa55word!"


@dataclass
class PKI:
    dir: Path
    ca: Path
    other_ca: Path  # a CA nobody here trusts
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def tls(self, ca: Path | None = None, client: bool = True) -> TLSSettings:
        certs = {"cert_file": self.client_cert, "key_file": self.client_key} if client else {}
        return TLSSettings(enabled=True, ca_file=ca or self.ca, **certs)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("memq-client")
    p = PKI(d, d / "ca.pem", d / "other-ca.pem", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")
    ca.cert_pem.write_to_path(str(p.ca))
    other.cert_pem.write_to_path(str(p.other_ca))
    server.cert_chain_pems[0].write_to_path(str(p.server_cert))
    server.private_key_pem.write_to_path(str(p.server_key))
    client.cert_chain_pems[0].write_to_path(str(p.client_cert))
    client.private_key_pem.write_to_path(str(p.client_key))
    for key in (p.server_key, p.client_key):
        key.chmod(0o600)
    d.chmod(0o755)  # servers running as their own user read the certificates
    for f in (p.ca, p.server_cert, p.client_cert):
        f.chmod(0o644)
    return p


# --- NATS ------------------------------------------------------------------------


async def test_nats_over_tls_with_a_client_certificate(pki, tmp_path, caplog):
    config = (
        f'tls {{ cert_file: "{pki.server_cert}", key_file: "{pki.server_key}", ca_file: "{pki.ca}", '
        "verify: true, timeout: 2 }"
    )
    with running_service(functools.partial(NatsServer, config=config)) as server:
        good = Settings(data_dir=tmp_path, nats={"url": server.url, "tls": pki.tls()})
        nc = await bus.connect(good, "tls-test")
        try:
            js = nc.jetstream()
            await bus.ensure_streams(js, good.streams)
            ack = await js.publish("memq.v1.ev.a.u.s", b"{}")
            assert ack.seq == 1 and nc.connected_url is not None
        finally:
            await nc.close()
        wrong_ca = Settings(data_dir=tmp_path, nats={"url": server.url, "tls": pki.tls(pki.other_ca)})
        with pytest.raises(bus.NatsTLSError, match="CERTIFICATE_VERIFY_FAILED"):
            await bus.connect(wrong_ca, "tls-test")
        no_client_cert = Settings(data_dir=tmp_path, nats={"url": server.url, "tls": pki.tls(client=False)})
        # the server's alert, or (when it was lost with the socket) the hang-up after the handshake
        with pytest.raises(bus.NatsTLSError, match="(?i)certificate required|requires a client certificate"):
            await bus.connect(no_client_cert, "tls-test")
    # asyncio's warning on each TLS close (nats.py#574) says nothing: `memq init` printed it on every TLS deployment
    assert not [r for r in caplog.records if "eof_received" in r.getMessage()]


# --- PostgreSQL --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_postgres(pki):
    """ssl=on; user memq only over TLS with a scram password; postgres trusted (setup)."""
    d = Path(tempfile.mkdtemp(prefix="memq-pg-tls-"))  # not under pytest's 0700 root: postgres reads it
    (d / "pg_hba.conf").write_text(
        "local all all trust\nhost all postgres 127.0.0.1/32 trust\n"
        "hostssl all memq 127.0.0.1/32 scram-sha-256\nhostnossl all memq 127.0.0.1/32 reject\n"
    )
    for f in (pki.server_cert, pki.server_key):
        shutil.copy(f, d / f.name)
    if os.geteuid() == 0:  # the server runs as postgres and wants its key private
        for f in d.iterdir():
            shutil.chown(f, "postgres", "postgres")
        shutil.chown(d, "postgres", "postgres")
    extra = {
        "ssl": "on",
        "ssl_cert_file": d / "server.crt",
        "ssl_key_file": d / "server.key",
        "hba_file": d / "pg_hba.conf",
    }
    with running_service(functools.partial(Postgres, extra_settings=extra)) as pg:
        pg.psql(f"CREATE ROLE memq LOGIN PASSWORD '{PASSWORD}'")
        pg.psql("CREATE DATABASE memq_tls OWNER memq")
        yield pg
    shutil.rmtree(d, ignore_errors=True)


def pg_settings(pg, tmp_path, password: str, tls: TLSSettings | None, query: str = "") -> Settings:
    db = {"url": f"postgresql+asyncpg://memq@127.0.0.1:{pg.port}/memq_tls{query}", "password": password}
    if tls is not None:
        db["tls"] = tls
    return Settings(data_dir=tmp_path, database=db)


async def test_postgres_over_tls_with_a_password(tls_postgres, pki, tmp_path):
    s = pg_settings(tls_postgres, tmp_path, PASSWORD, pki.tls(client=False))
    assert PASSWORD not in str(s.public_dict())
    engine = create_engine(s.database_url())
    try:
        await migrate(engine)
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))).scalar_one()
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    "case, match",
    [
        ("wrong password", "password authentication failed"),
        ("wrong CA", "CERTIFICATE_VERIFY_FAILED"),
        ("no TLS", "no encryption"),
    ],
)
async def test_postgres_refusals_say_why(tls_postgres, pki, tmp_path, case, match):
    password = "not-the-password" if case == "wrong password" else PASSWORD
    tls = None if case == "no TLS" else pki.tls(pki.other_ca if case == "wrong CA" else None, client=False)
    query = "?sslmode=disable" if case == "no TLS" else ""  # asyncpg would "prefer" TLS by itself
    engine = create_engine(pg_settings(tls_postgres, tmp_path, password, tls, query).database_url())
    try:
        with pytest.raises(Exception, match=match) as refused:
            async with engine.connect():
                pass
        assert PASSWORD not in str(refused.value) and "not-the-password" not in str(refused.value)
    finally:
        await engine.dispose()


# --- Redis -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_redis(pki):
    port = free_port()
    args = [
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(pki.server_cert),
        "--tls-key-file",
        str(pki.server_key),
        "--tls-ca-cert-file",
        str(pki.ca),
        "--tls-auth-clients",
        "yes",
        "--requirepass",
        PASSWORD,
    ]
    with running_service(functools.partial(Redis, port=port, extra_args=args)) as server:
        yield server


def redis_settings(server, tmp_path, password: str, tls: TLSSettings) -> Settings:
    cache = {"redis_url": f"redis://127.0.0.1:{server.port}/0", "redis_password": password, "redis_tls": tls}
    return Settings(data_dir=tmp_path, cache=cache)


async def test_redis_over_tls_with_a_password_and_client_certificate(tls_redis, pki, tmp_path):
    s = redis_settings(tls_redis, tmp_path, PASSWORD, pki.tls())
    assert s.cache.redis_url.get_secret_value().startswith("rediss://")
    assert PASSWORD not in str(s.public_dict())
    backend = RedisBackend(s.cache.redis_url.get_secret_value(), 60)
    try:
        await backend.store("memq:q:test", b"value", 60)
        assert await backend.redis.get("memq:q:test") == b"value"
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "case, match",
    [
        ("wrong password", "(?i)invalid username-password|WRONGPASS"),
        ("wrong CA", "CERTIFICATE_VERIFY_FAILED"),
        ("no client certificate", "(?i)certificate|connection reset|closed"),
    ],
)
async def test_redis_refusals_say_why(tls_redis, pki, tmp_path, case, match):
    password = "not-the-password" if case == "wrong password" else PASSWORD
    tls = pki.tls(pki.other_ca if case == "wrong CA" else None, client=case != "no client certificate")
    backend = RedisBackend(redis_settings(tls_redis, tmp_path, password, tls).cache.redis_url.get_secret_value(), 60)
    try:
        with pytest.raises(Exception, match=match) as refused:
            await backend.redis.ping()
        assert PASSWORD not in str(refused.value) and "not-the-password" not in str(refused.value)
    finally:
        await backend.close()


# --- Weaviate ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_weaviate():
    env = {
        "AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED": "false",
        "AUTHENTICATION_APIKEY_ENABLED": "true",
        "AUTHENTICATION_APIKEY_ALLOWED_KEYS": PASSWORD,
        "AUTHENTICATION_APIKEY_USERS": "memq",
    }
    with running_service(functools.partial(Weaviate, extra_env=env)) as server:
        yield server


def weaviate_index(server, key: str | None) -> WeaviateIndex:
    return WeaviateIndex(
        WeaviateSettings(
            url=server.url, grpc_port=server.grpc_port, api_key=SecretStr(key) if key else None, timeout_s=5
        )
    )


async def test_weaviate_with_an_api_key(keyed_weaviate):
    index = weaviate_index(keyed_weaviate, PASSWORD)
    await index.open()
    try:
        meta = await index.create_generation("test-model", 4)
        assert [g.generation for g in await index.generations()] == [meta.generation]
    finally:
        await index.close()


@pytest.mark.parametrize("key", ["not-the-key", None])
async def test_weaviate_refuses_a_wrong_or_missing_key(keyed_weaviate, key):
    index = weaviate_index(keyed_weaviate, key)
    with pytest.raises((IndexUnavailable, Exception), match="(?i)401|unauthori[sz]ed|anonymous") as refused:
        await index.open()
        try:
            await index.generations()
        finally:
            await index.close()
    assert PASSWORD not in str(refused.value) and "not-the-key" not in str(refused.value)
