"""The test servers themselves: they start, answer, and survive kill + restart."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import asyncmy
import asyncpg
import nats
from services import HOST, port_open
from sqlalchemy.engine import make_url


async def test_nats_answers(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        sub = await nc.subscribe("ping")
        await nc.publish("ping", b"hi")
        assert (await sub.next_msg(timeout=2)).data == b"hi"
        assert (await nc.jetstream().account_info()).streams >= 0
    finally:
        await nc.close()


async def test_jetstream_message_survives_kill_and_restart(fresh_nats):
    nc = await nats.connect(fresh_nats.url)
    js = nc.jetstream()
    await js.add_stream(name="SURVIVE", subjects=["survive.>"])
    ack = await js.publish("survive.1", b"still here")
    await nc.close()

    old_pid, port = fresh_nats.pid, fresh_nats.port
    fresh_nats.kill()
    assert not port_open(HOST, port)
    fresh_nats.restart()
    assert fresh_nats.port == port and fresh_nats.pid != old_pid

    nc = await nats.connect(fresh_nats.url)
    try:
        msg = await nc.jetstream().get_msg("SURVIVE", ack.seq)
        assert msg.data == b"still here"
    finally:
        await nc.close()


async def test_pg_url_is_a_fresh_database(pg_url):
    url = make_url(pg_url)
    assert url.drivername == "postgresql+asyncpg" and url.host == HOST
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        assert await conn.fetchval("SELECT current_database()") == url.database
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    finally:
        await conn.close()


async def test_postgres_row_survives_kill_and_restart(postgres, pg_url):
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text)")
    await conn.execute("INSERT INTO t VALUES (1, 'committed')")

    postgres.kill()  # the open connection dies with it
    assert not port_open(HOST, postgres.port)
    postgres.restart()

    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT body FROM t WHERE id = 1") == "committed"
    finally:
        await conn.close()


async def test_mariadb_answers_in_utf8mb4(mariadb_url):
    url = make_url(mariadb_url)
    conn = await asyncmy.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, db=url.database, charset="utf8mb4"
    )
    try:
        async with conn.cursor() as cur:
            await cur.execute("CREATE TABLE t (id INT PRIMARY KEY, body TEXT)")
            await cur.execute("INSERT INTO t VALUES (1, %s)", ("café 🧠",))
            await conn.commit()
            await cur.execute("SELECT body FROM t WHERE id = 1")
            assert (await cur.fetchone())[0] == "café 🧠"
    finally:
        conn.close()


async def test_redis_answers(redis_server):
    import redis.asyncio as aioredis  # here: not yet a declared dependency of memq

    r = aioredis.Redis.from_url(redis_server.url)
    try:
        await r.set("k", "v")
        assert await r.get("k") == b"v"
    finally:
        await r.aclose()


def test_sqlite_url_points_into_tmp_path(sqlite_url, tmp_path):
    assert sqlite_url == f"sqlite+aiosqlite:///{tmp_path}/memq.db"


def test_servers_die_with_the_test_process(tmp_path):
    # A child Python starts Redis, then dies by SIGKILL: no atexit, no cleanup.
    script = textwrap.dedent(f"""
        import os, signal
        from services import Redis
        r = Redis(workdir={str(tmp_path)!r}).start()
        print(r.pid, r.port, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    tests = str(Path(__file__).parents[1])  # where `services` is, as pytest's pythonpath has it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, env=env)
    pid, port = map(int, out.stdout.split())

    deadline = time.monotonic() + 5
    while port_open(HOST, port) or _alive(pid):
        assert time.monotonic() < deadline, f"redis (pid {pid}) outlived the process that started it"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    # An orphan that init has not reaped yet (a zombie) is dead too.
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
