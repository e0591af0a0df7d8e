"""What the existence check of ``create=False`` and of a checked delete costs.

Usage::

    .venv/bin/python tests/run_bench.py existence_check [--n N]

One nats-server (``tests/services.py``), a SQLite file, and the persistence
and query workers in this process. One session with a few turns; then, one
call at a time, alternating in each round so a slow moment of a shared
machine favours neither: ``append_text`` with ``create=True`` (one publish)
and with ``create=False`` (a ``session.get`` with ``consistency="any"``
first, then the publish); ``delete_session`` with ``missing_ok=True`` and
the checked default, each on a session of its own. p50/p99 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import services
from helpers import make_settings, running_query, running_worker

from memq.contracts.client import MemoryClient

APP, USER = "bench-exists", "u"


def summary(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"p50 {statistics.median(ms):6.2f} ms  p99 {ms[int(0.99 * (len(ms) - 1))]:6.2f} ms"


async def timed(call) -> float:
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


async def main(n: int) -> None:
    with services.NatsServer() as nats, tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{tmp}/memq.db", Path(tmp))
        async with running_worker(settings), running_query(settings):
            async with await MemoryClient.connect(nats.url, app=APP) as client:
                for i in range(5):
                    await client.append_text(USER, "s", "user", f"turn {i}")
                found: dict[str, list[float]] = {k: [] for k in ("create", "check", "missing_ok", "checked")}
                for i in range(n):
                    for key in ("create", "check") if i % 2 else ("check", "create"):
                        found[key].append(
                            await timed(client.append_text(USER, "s", "user", f"more {i}", create=key == "create"))
                        )
                    for key in ("missing_ok", "checked") if i % 2 else ("checked", "missing_ok"):
                        session = f"d-{key}-{i}"
                        await client.append_text(USER, session, "user", "to delete")
                        found[key].append(
                            await timed(client.delete_session(USER, session, missing_ok=key == "missing_ok"))
                        )
    print(f"append_text create=True            {summary(found['create'])}")
    print(f"append_text create=False           {summary(found['check'])}")
    print(f"delete_session missing_ok=True     {summary(found['missing_ok'])}")
    print(f"delete_session (checked, default)  {summary(found['checked'])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="calls of each kind")
    asyncio.run(main(parser.parse_args().n))
