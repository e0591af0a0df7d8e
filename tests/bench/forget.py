"""What ``forget_event`` costs, checked (the default) and with ``missing_ok``.

Usage::

    .venv/bin/python tests/run_bench.py forget [--n N] [--json PATH]

The adapter tests' stack (``tests/adapter_stack.py``: a nats-server,
SQLite, and the persistence, indexing and query workers in this process).
For each mode, a session of N + 10 turns, committed; then N forgets, one at
a time, of its oldest turns; then one read with ``consistency="any"`` (it
waits until every forget is committed) that must hold the 10 left. p50/p90
of the forgets and the read's time, in ms, as a table and (``--json``) as
rows.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from adapter_stack import memq_stack
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, warn_if_busy, write_json
from memq.contracts.client import MemoryClient


def print_rows(rows: list[dict]) -> None:
    table = Table(title="forget_event: one forget at a time, then one read of what is left, ms")
    for column in ("call", "forgets", "p50", "p90", "read after"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for r in rows:
        table.add_row(r["call"], str(r["n"]), f"{r['p50_ms']:.1f}", f"{r['p90_ms']:.1f}", f"{r['read_after_ms']:.0f}")
    console.print(table)


async def measure(data_dir: Path, n: int) -> list[dict]:
    rows = []
    async with memq_stack(data_dir) as url, await MemoryClient.connect(url, app="bench") as memq:
        for missing_ok in (False, True):
            user = f"u{uuid.uuid4().hex[:6]}"
            seqs = [await memq.append_text(user, "s", "user", f"turn {i}") for i in range(n + 10)]
            await memq.get_session(user, "s", consistency="any")
            times = []
            for seq in seqs[:n]:
                started = time.perf_counter()
                await memq.forget_event(user, "s", seq, missing_ok=missing_ok)
                times.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            view = await memq.get_session(user, "s", events=True, consistency="any")
            settled = (time.perf_counter() - started) * 1000
            assert [e.seq for e in view.events or ()] == seqs[n:]
            rows.append(
                {
                    "call": f"forget_event missing_ok={missing_ok}",
                    "n": n,
                    "p50_ms": percentile(times, 50),
                    "p90_ms": percentile(times, 90),
                    "read_after_ms": settled,
                }
            )
    return rows


async def main(n: int, json_path: Path | None) -> None:
    machine = machine_info()
    warn_if_busy(machine)
    with tempfile.TemporaryDirectory(prefix="memq-bench-forget-") as tmp:
        rows = await measure(Path(tmp), n)
    print_rows(rows)
    write_json(json_path, "forget", machine, config={"n": n}, rows=rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.json))
