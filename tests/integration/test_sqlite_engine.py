"""SQLite as memq uses it: separate `memq worker` processes migrating one
fresh file at once, and the `inmemory` backend shared by the workers of one
process (issue 11)."""

from __future__ import annotations

import subprocess
import sys
import time

from sqlalchemy import text

from memq.workers.sql.engine import create_engine, current_revision, migrate

# One process: import first, then migrate at the agreed moment, so that the
# processes really start their migrations together.
MIGRATE_AT = """
import asyncio, sys, time
from memq.workers.sql.engine import create_engine, migrate
url, at = sys.argv[1], float(sys.argv[2])

async def main():
    engine = create_engine(url)
    try:
        await migrate(engine)
    finally:
        await engine.dispose()

time.sleep(max(0.0, at - time.time()))
asyncio.run(main())
"""


def test_processes_migrating_one_fresh_sqlite_file_at_once_all_succeed(tmp_path):
    """Before: one died with "table memq_app_state already exists"."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'memq.db'}"
    at = time.time() + 8  # time enough for every process to import on a busy machine
    procs = [
        subprocess.Popen([sys.executable, "-c", MIGRATE_AT, url, str(at)], stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    failures = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(f for f in failures if f)


async def test_inmemory_engines_of_one_loop_share_one_database():
    first = create_engine("sqlite+aiosqlite:///:memory:")
    second = create_engine("sqlite+aiosqlite:///:memory:")
    try:
        await migrate(first)
        assert await current_revision(second) is not None  # the same database
    finally:
        await first.dispose()
    async with second.connect() as conn:  # one owner's dispose keeps it for the others
        assert (await conn.execute(text("SELECT count(*) FROM alembic_version"))).scalar() == 1
    await second.dispose()
