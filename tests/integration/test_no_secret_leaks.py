"""No secret is ever printed or logged: real `memq worker` processes at DEBUG,
`memq config`, and commands that fail to connect with a wrong password, all
with distinctive secret values that must appear in no output."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import bcrypt
import pytest
from helpers import MEMQ, WorkerProcess, make_settings, settings_env, wait_for
from services import NatsServer, Postgres, Redis
from services import running as running_service

from memq.contracts.client import MemoryClient
from memq.workers import security

pytestmark = pytest.mark.timeout(300)

APP = "leak-app"
SECRETS = {
    "MEMQ_NATS__PASSWORD": "natsSECRET-4b1f9",
    "MEMQ_DATABASE__PASSWORD": "pgSECRET-77a2c",
    "MEMQ_CACHE__REDIS_PASSWORD": "redisSECRET-9e0d3",
    "MEMQ_INDEXING__WEAVIATE__API_KEY": "weaviateSECRET-1c2d",
    "MEMQ_INDEXING__OPENAI__API_KEY": "openaiSECRET-5f6a",
    "MEMQ_SUMMARIZER__LLM__API_KEY": "llmSECRET-8b9c",
}
APP_PASSWORD = "appSECRET-3d4e"
ALL = [*SECRETS.values(), APP_PASSWORD]


def leaks(text: str) -> list[str]:
    return [s for s in ALL if s in text or quote(s, safe="") in text or s.lower() in text.lower()]


@pytest.fixture(scope="module")
def stack():
    """NATS with password users, PostgreSQL with a scram password, Redis with requirepass."""
    hashed = {
        "workers": bcrypt.hashpw(SECRETS["MEMQ_NATS__PASSWORD"].encode(), bcrypt.gensalt(4)).decode(),
        security.app_user_name(APP): bcrypt.hashpw(APP_PASSWORD.encode(), bcrypt.gensalt(4)).decode(),
    }
    memq_users, _ = security.build_users([APP], hashed, admin=False, system_user=False)
    pg_dir = Path(tempfile.mkdtemp(prefix="memq-pg-hba-"))  # readable by the postgres user
    (pg_dir / "pg_hba.conf").write_text(
        "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all memq 127.0.0.1/32 scram-sha-256\n"
    )
    if os.geteuid() == 0:
        shutil.chown(pg_dir, "postgres", "postgres")
        shutil.chown(pg_dir / "pg_hba.conf", "postgres", "postgres")
    redis_args = ["--requirepass", SECRETS["MEMQ_CACHE__REDIS_PASSWORD"]]
    with (
        running_service(functools.partial(NatsServer, config=security.render_accounts(memq_users, []))) as nats_server,
        running_service(functools.partial(Postgres, extra_settings={"hba_file": pg_dir / "pg_hba.conf"})) as pg,
        running_service(functools.partial(Redis, extra_args=redis_args)) as redis,
    ):
        pg.psql(f"CREATE ROLE memq LOGIN PASSWORD '{SECRETS['MEMQ_DATABASE__PASSWORD']}'")
        pg.psql("CREATE DATABASE memq_leaks OWNER memq")
        yield nats_server, pg, redis
    shutil.rmtree(pg_dir, ignore_errors=True)


def environment(stack, tmp_path: Path, **changes: str) -> tuple:
    nats_server, pg, redis = stack
    settings = make_settings(nats_server.url, f"postgresql+asyncpg://memq@127.0.0.1:{pg.port}/memq_leaks", tmp_path)
    env = {
        **SECRETS,
        "MEMQ_NATS__USER": "workers",
        "MEMQ_CACHE__REDIS_URL": redis.url,
        "MEMQ_INDEXING__WEAVIATE__URL": "http://127.0.0.1:9",  # set, never used by these workers
        "MEMQ_LOG_LEVEL": "DEBUG",
        **changes,
    }
    return settings, env


def run_cli(settings, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MEMQ), *args], env={**settings_env(settings), **env}, capture_output=True, text=True, timeout=60
    )


async def test_workers_at_debug_log_no_secret(stack, tmp_path):
    settings, env = environment(stack, tmp_path)
    workers = [
        WorkerProcess(settings, tmp_path / f"{kind}.log", kind, env).start() for kind in ("persistence", "query")
    ]
    try:
        await wait_for_consumer_as_app(stack[0].url)
        async with await MemoryClient.connect(
            stack[0].url, app=APP, user=security.app_user_name(APP), password=APP_PASSWORD
        ) as client:
            for i in range(5):
                await client.append_text("u", "s", "user", f"message {i}")
            for _ in range(2):  # the second from the Redis cache
                assert len((await client.history("u", "s")).events) == 5
    finally:
        for w in workers:
            w.stop()
    for w in workers:
        log = w.log_path.read_text()
        assert "DEBUG" in log or "debug" in log.lower(), f"{w.kind} did not log at DEBUG:\n{w.log_tail()}"
        assert leaks(log) == [], f"{w.kind} logged a secret:\n{log[-3000:]}"


async def wait_for_consumer_as_app(url: str) -> None:
    """Until the persistence worker is consuming (checked through the query service)."""

    async def answering() -> bool:
        async with await MemoryClient.connect(
            url, app=APP, user=security.app_user_name(APP), password=APP_PASSWORD, timeout=1.0
        ) as client:
            await client.list_sessions(min_seq=0)
            return True

    await wait_for(answering, 60, "the query worker")


@pytest.mark.parametrize(
    "case",
    [
        "memq config",
        "nats wrong password",
        "postgres wrong password",
        "redis wrong password",
        "workers with wrong passwords",
    ],
)
async def test_failures_and_config_print_no_secret(stack, tmp_path, case):
    settings, env = environment(stack, tmp_path)
    if case == "memq config":
        result = run_cli(settings, env, "config")
        assert result.returncode == 0 and "***" in result.stdout
        output = result.stdout + result.stderr
    elif case == "nats wrong password":
        result = run_cli(settings, {**env, "MEMQ_NATS__PASSWORD": "natsSECRET-wrong-0000"}, "status")
        output = result.stdout + result.stderr
        assert result.returncode == 1 and "refused the credentials" in output
        assert "natsSECRET-wrong-0000" not in output
    elif case == "postgres wrong password":
        result = run_cli(settings, {**env, "MEMQ_DATABASE__PASSWORD": "pgSECRET-wrong-0000"}, "init")
        output = result.stdout + result.stderr
        assert result.returncode != 0 and "password authentication failed" in output
        assert "pgSECRET-wrong-0000" not in output
    elif case == "redis wrong password":
        # The cache degrades to SQL (a warning), the query still answers.
        bad = {**env, "MEMQ_CACHE__REDIS_PASSWORD": "redisSECRET-wrong-0000"}
        worker = WorkerProcess(settings, tmp_path / "query.log", "query", bad).start()
        persistence = WorkerProcess(settings, tmp_path / "persistence.log", "persistence", env).start()
        try:
            await wait_for_consumer_as_app(stack[0].url)
            async with await MemoryClient.connect(
                stack[0].url, app=APP, user=security.app_user_name(APP), password=APP_PASSWORD
            ) as client:
                await client.append_text("u", "r", "user", "hello")
                await client.history("u", "r")
        finally:
            worker.stop()
            persistence.stop()
        output = worker.log_path.read_text()
        assert "AuthenticationError" in output and "answering from SQL" in output, worker.log_tail()
        assert "redisSECRET-wrong-0000" not in output
    else:  # a worker that cannot reach its database at all, with every secret set
        bad = {**env, "MEMQ_DATABASE__PASSWORD": "pgSECRET-wrong-0000"}
        worker = WorkerProcess(settings, tmp_path / "persistence.log", "persistence", bad).start()
        try:
            worker.proc.wait(60)
        except subprocess.TimeoutExpired:
            worker.stop()
        output = worker.log_path.read_text()
        assert "password authentication failed" in output, worker.log_tail()
        assert "pgSECRET-wrong-0000" not in output
    assert leaks(output) == [], output[-3000:]
