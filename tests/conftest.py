"""Fixtures that start real servers (see services.py); each starts only when asked for.

Session servers, shared by the whole run:
    nats_server, postgres, mariadb, redis_server, weaviate_server, llama_server
Per test:
    fresh_nats   a new nats-server (kill/restart it, or use its empty JetStream)
    nats_cluster a new 3-node JetStream cluster (kill/restart one of .nodes)
    nats_url     fresh_nats.url
    pg_url, mariadb_url, sqlite_url   a new empty database's SQLAlchemy URL

A missing server binary skips the test, except with CI=true, where it fails:
CI must never pass by skipping.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from services import (
    LlamaEmbeddingServer,
    LlamaServer,
    MariaDB,
    NatsCluster,
    NatsServer,
    Postgres,
    Redis,
    Weaviate,
    running,
)

SERVICE_FIXTURES = {
    "nats_server",
    "postgres",
    "mariadb",
    "redis_server",
    "fresh_nats",
    "nats_url",
    "pg_url",
    "mariadb_url",
    "weaviate_server",
    "llama_server",
    "llama_embedding_server",
    "nats_cluster",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Lets `pytest -m "not services"` run only what needs no server.
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with running(NatsServer) as s:
        yield s


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    with running(Postgres) as s:
        yield s


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDB]:
    with running(MariaDB) as s:
        yield s


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Redis]:
    with running(Redis) as s:
        yield s


@pytest.fixture(scope="session")
def weaviate_server() -> Iterator[Weaviate]:
    with running(Weaviate) as s:
        yield s


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    with running(LlamaServer) as s:
        yield s


@pytest.fixture(scope="session")
def llama_embedding_server() -> Iterator[LlamaEmbeddingServer]:
    with running(LlamaEmbeddingServer) as s:
        yield s


@pytest.fixture
def fresh_nats() -> Iterator[NatsServer]:
    with running(NatsServer) as s:
        yield s


@pytest.fixture
def nats_cluster() -> Iterator[NatsCluster]:
    with running(NatsCluster) as s:
        yield s


@pytest.fixture
def nats_url(fresh_nats: NatsServer) -> str:
    return fresh_nats.url


_db_counter = itertools.count(1)


@pytest.fixture
def db_name(request: pytest.FixtureRequest) -> str:
    """A database name unique in this run, readable in server logs."""
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    return f"t{next(_db_counter)}_{slug}"[:63]


@pytest.fixture
def pg_url(postgres: Postgres, db_name: str) -> Iterator[str]:
    postgres.start()  # no-op, unless an earlier outage test left it down
    yield postgres.create_database(db_name)
    if postgres.running:
        postgres.drop_database(db_name)


@pytest.fixture
def mariadb_url(mariadb: MariaDB, db_name: str) -> Iterator[str]:
    mariadb.start()
    yield mariadb.create_database(db_name)
    if mariadb.running:
        mariadb.drop_database(db_name)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/memq.db"
