"""What the existence check of ``create=False`` and of a checked delete costs.

Usage::

    .venv/bin/python tests/run_bench.py existence_check [--n N] [--json PATH]

One nats-server (``tests/services.py``), a SQLite file, and the persistence
and query workers in this process. One session with a few turns; then, one
call at a time, alternating in each round so a slow moment of a shared
machine favours neither: ``append_text`` with ``create=True`` (one publish)
and with ``create=False`` (a ``session.get`` with ``consistency="any"``
first, then the publish); ``delete_session`` with ``missing_ok=True`` and
the checked default, each on a session of its own. p50/p99 in ms, as a
table and (``--json``) as rows.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import services
from helpers import make_settings, running_query, running_worker
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, warn_if_busy, write_json
from memq.contracts.client import MemoryClient

APP, USER = "bench-exists", "u"
# Each kind of call timed, by the key main() files its samples under.
CALLS = {
    "create": "append_text create=True",
    "check": "append_text create=False",
    "missing_ok": "delete_session missing_ok=True",
    "checked": "delete_session (checked, default)",
}


def rows_of(found: dict[str, list[float]]) -> list[dict]:
    """One row per kind of call: how many, p50 and p99 in ms."""
    rows = []
    for key, call in CALLS.items():
        ms = [s * 1000 for s in found[key]]
        rows.append({"call": call, "n": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)})
    return rows


def print_rows(rows: list[dict]) -> None:
    table = Table(title="existence checks: one call at a time, ms")
    for column in ("call", "calls", "p50", "p99"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for r in rows:
        table.add_row(r["call"], str(r["n"]), f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}")
    console.print(table)


async def timed(call) -> float:
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


async def main(n: int, json_path: Path | None) -> None:
    machine = machine_info()
    warn_if_busy(machine)
    with services.NatsServer() as nats, tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{tmp}/memq.db", Path(tmp))
        async with running_worker(settings), running_query(settings):
            async with await MemoryClient.connect(nats.url, app=APP) as client:
                for i in range(5):
                    await client.append_text(USER, "s", "user", f"turn {i}")
                found: dict[str, list[float]] = {k: [] for k in CALLS}
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
    rows = rows_of(found)
    print_rows(rows)
    write_json(json_path, "existence_check", machine, config={"n": n}, rows=rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="calls of each kind")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.json))
