"""What `memq up` and `memq worker` check before anything starts
(memq.workers.cli.preflight): each problem one line saying what to change."""

from __future__ import annotations

import socket

import pytest

from memq.workers.cli.preflight import data_dir_problem, needed_packages, port_problem, problems
from memq.workers.settings import Settings

ALL = ["persistence", "indexing", "summarizer", "query", "http"]


def settings(tmp_path, **overrides) -> Settings:
    return Settings(data_dir=tmp_path, **{"http": {"port": 0}, "nats": {"port": 0}, **overrides})


@pytest.fixture
def listening():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_port_is_named_with_the_option_that_changes_it(listening):
    problem = port_problem("the HTTP gateway", "127.0.0.1", listening, "pick another with --http-port")
    assert problem is not None
    assert problem.startswith(f"the HTTP gateway cannot listen on 127.0.0.1:{listening} (")
    assert problem.endswith("pick another with --http-port")


def test_port_zero_and_a_free_port_are_fine():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    assert port_problem("x", "127.0.0.1", 0, "") is None
    assert port_problem("x", "127.0.0.1", free, "") is None


def test_every_listener_of_up_is_checked(tmp_path, listening):
    for section, option in (("nats", "--nats-port"), ("http", "--http-port"), ("metrics", "MEMQ_METRICS__PORT")):
        found = problems(settings(tmp_path, **{section: {"port": listening}}), ALL, embedded_nats=True)
        assert len(found) == 1 and f"127.0.0.1:{listening}" in found[0] and option in found[0], found


def test_two_listeners_on_one_port_are_a_problem(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    found = problems(settings(tmp_path, nats={"port": free}, http={"port": free}), ALL, embedded_nats=True)
    assert found == [
        f"the HTTP gateway and the embedded nats-server are both set to port {free}: "
        "pick another with --http-port or MEMQ_HTTP__PORT"
    ]


def test_a_lone_worker_checks_only_its_own_port(tmp_path, listening):
    s = settings(tmp_path, http={"port": listening}, nats={"port": listening, "url": "nats://x:4222"})
    assert problems(s, ["query"], embedded_nats=False) == []
    assert len(problems(s, ["http"], embedded_nats=False)) == 1


def test_a_data_dir_that_cannot_be_made_is_a_problem(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    problem = data_dir_problem(a_file / "memq")
    assert problem is not None and problem.startswith(f"the data dir {a_file / 'memq'} is not usable (")
    assert "MEMQ_DATA_DIR" in problem
    assert data_dir_problem(tmp_path / "new" / "memq") is None and (tmp_path / "new" / "memq").is_dir()


def test_a_missing_package_names_what_needs_it_and_how_to_install_it(tmp_path):
    found = problems(settings(tmp_path), ALL, embedded_nats=False, installed=lambda p: p != "onnxruntime")
    assert found == [
        "onnxruntime is not installed, and the local embedder (indexing.embedder=local; `none`: keyword "
        "search only) needs it: pip install 'memq[workers]'"
    ]


@pytest.mark.parametrize(
    ("overrides", "kinds", "package"),
    [
        ({}, ["http"], "uvicorn"),
        ({"indexing": {"embedder": "openai"}}, ["indexing"], "httpx"),
        ({"indexing": {"weaviate": {"url": "http://w:8080"}}}, ["query"], "weaviate"),
        ({"cache": {"redis_url": "redis://r:6379"}}, ["query"], "redis"),
        ({"summarizer": {"kind": "llm"}}, ["summarizer"], "httpx"),
        ({"database": {"url": "postgresql+asyncpg://u@db/memq"}}, ["persistence"], "asyncpg"),
        ({}, ["persistence"], "aiosqlite"),
    ],
)
def test_what_the_settings_need_is_asked_for(tmp_path, overrides, kinds, package):
    assert package in needed_packages(settings(tmp_path, **overrides), kinds)


def test_what_the_settings_do_not_use_is_not_asked_for(tmp_path):
    needed = needed_packages(settings(tmp_path, indexing={"embedder": "none"}), ALL)
    assert not {"onnxruntime", "tokenizers", "weaviate", "redis", "httpx"} & set(needed)
    assert "uvicorn" not in needed_packages(settings(tmp_path), ["persistence"])


def test_a_replica_that_writes_no_data_dir_does_not_need_one(tmp_path):
    """As in infra/k8s: a read-only disk, a database server and Weaviate."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    servers = {
        "database": {"url": "postgresql+asyncpg://u@db/memq"},
        "indexing": {"weaviate": {"url": "http://w:8080"}},
    }
    s = Settings(data_dir=a_file / "memq", nats={"url": "nats://n:4222"}, http={"port": 0}, **servers)
    assert problems(s, ["persistence"], embedded_nats=False) == []
    assert problems(s, ["http"], embedded_nats=False) == []
    sqlite = Settings(data_dir=a_file / "memq", nats={"url": "nats://n:4222"}, http={"port": 0})
    assert len(problems(sqlite, ["persistence"], embedded_nats=False)) == 1  # its SQLite file is there
    assert problems(sqlite, ["http"], embedded_nats=False) == []
