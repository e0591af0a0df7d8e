"""LangGraph store benchmark: MemqStore's ops beside the MemoryClient calls
they are made of, in the same run.

Usage::

    .venv/bin/python tests/run_bench.py langgraph_store [--items N] [--rounds R] [--json PATH]

One in-process stack (tests/adapter_stack.py: a nats-server, SQLite, the
persistence, keyword-only indexing and query workers). ``--items`` items are
put under one user first, then each op is timed one call at a time, for
``--rounds`` calls, alternating with the client call beside it (p50 and
p99, ms):

- ``put``: ``MemqStore.aput`` of an indexed item (a session delete and an
  append) beside ``MemoryClient.append`` alone;
- ``get``: ``aget`` beside ``MemoryClient.get_state`` (what it reads);
- ``search``: ``asearch`` with a query beside ``MemoryClient.search``;
- ``list``: ``asearch`` without a query (a listing of the user's sessions,
  then a read of the page's items) and ``alist_namespaces``.

Reads use ``consistency="any"``, as the store does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from adapter_stack import memq_stack
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, status, warn_if_busy
from memq.contracts.adapters.langgraph import MemqStore
from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotCommitted

USER = "ann"
NS = (USER, "memories")


async def timed(rounds: int, *calls: Callable[[int], Awaitable[object]]) -> list[dict[str, float]]:
    """p50/p99 of each call, one at a time; several calls alternate in each
    round (the first one first in odd rounds), so a slow moment of a shared
    machine (the workers still busy with the writes before) favours none."""
    took: list[list[float]] = [[] for _ in calls]
    for i in range(rounds):
        order = list(enumerate(calls))
        for n, call in order if i % 2 == 0 else reversed(order):
            start = time.perf_counter()
            await call(i)
            took[n].append((time.perf_counter() - start) * 1000)
    return [{"p50_ms": round(percentile(t, 50), 2), "p99_ms": round(percentile(t, 99), 2)} for t in took]


async def run(items: int, rounds: int) -> dict[str, dict[str, float]]:
    async with memq_stack(Path(tempfile.mkdtemp(prefix="bench-lg"))) as url:
        async with await MemoryClient.connect(url, app="bench-lg") as memq:
            store = MemqStore(memq)
            status(f"putting {items} items")
            await asyncio.gather(
                *(store.aput(NS, f"k{i}", {"text": f"note {i} about topic {i % 7}"}) for i in range(items))
            )
            while True:  # until they are indexed: a search waits wait_ms at most
                try:
                    await store.asearch(NS, query="topic")
                    break
                except NotCommitted:
                    continue
            session = "bench-append"
            r: dict[str, dict[str, float]] = {}
            status("timing")
            r["put (MemqStore.aput)"], r["  append (client)"] = await timed(
                rounds,
                lambda i: store.aput(NS, f"p{i}", {"text": f"put {i}"}),
                lambda i: memq.append_text(USER, session, "user", f"put {i}"),
            )
            await store.aget(NS, "k0")  # the timed puts' commits, waited for once, not by the first timed read
            r["get (MemqStore.aget)"], r["  get_state (client)"] = await timed(
                rounds,
                lambda i: store.aget(NS, f"k{i % items}"),
                # items the store has not read: the query worker caches what it read
                lambda i: memq.get_state(USER, f"langgraph.2.ann.memories.k{(i + rounds) % items}", consistency="any"),
            )
            r["search (MemqStore.asearch, query)"], r["  search (client)"] = await timed(
                rounds,
                lambda i: store.asearch(NS, query=f"topic {i % 7}", limit=10),
                lambda i: memq.search(USER, f"topic {i % 7}", k=100, authors=["memory"], consistency="any"),
            )
            r["list (MemqStore.asearch, no query)"], r["list_namespaces"] = await timed(
                rounds, lambda i: store.asearch(NS, limit=10), lambda i: store.alist_namespaces()
            )
            return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    machine = machine_info()
    warn_if_busy(machine)
    results = asyncio.run(run(args.items, args.rounds))
    table = Table(title=f"MemqStore, {args.items} items, {args.rounds} calls each (ms)")
    for column in ("op", "p50", "p99"):
        table.add_column(column)
    for op, r in results.items():
        table.add_row(op, f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}")
    console.print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "args": vars(args) | {"json": str(args.json)}, "results": results}, indent=2
            )
        )


if __name__ == "__main__":
    main()
