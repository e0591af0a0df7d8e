"""What a client searching all along sees while the index is rebuilt and
switched (issue 32, "no blip"): answers, empty answers and errors.

A real stack in this process (a fresh nats-server, SQLite, the persistence,
indexing and query workers, the local embedder), ``--events`` turns of a
few users, then a client searches every ``--every-ms`` while ``rebuild``
(the API ``memq index rebuild`` uses, on a backend of its own as that
process has) replays the stream into a new generation and switches to it,
and for ``--after-s`` more. Before issue 32's fix this measured one error at
the switch (2,243 answers, 0 empty, 1 error in the issue). It prints a
table and, with ``--json PATH``, writes the same figures there.

    PYTHONPATH=<shim> .venv/bin/python tests/run_bench.py rebuild_blip --events 1000 --every-ms 50 --json blip.json
    PYTHONPATH=<shim> .venv/bin/python tests/run_bench.py rebuild_blip --backend weaviate
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from helpers import SharedEmbedder, make_settings, running, running_query, running_worker, wait_for
from rich.markup import escape
from rich.table import Table
from services import NatsServer, Weaviate

from bench.benchlib import console, machine_info, status, warn_if_busy, write_json
from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.backends import open_backend
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.indexer import make_indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.settings import LocalEmbedderSettings
from memq.workers.sql.engine import create_engine

APP = "blip"
USERS = ("alice", "bob", "carol")
TOPICS = ["my dog Max", "the trip to Lisbon", "the garden", "my sister's wedding", "the new job", "piano lessons"]
QUERIES = ["what is my dog called?", "when is the trip", "wedding plans", "how is the garden"]


async def measure(args: argparse.Namespace, nats_url: str, data: Path, weaviate: Weaviate | None) -> dict:
    s = make_settings(nats_url, f"sqlite+aiosqlite:///{data}/memq.db", data)
    extra = {}
    if weaviate is not None:
        extra = {
            "weaviate": {"url": weaviate.url, "grpc_port": weaviate.grpc_port, "collection": f"B{uuid.uuid4().hex[:8]}"}
        }
    s.indexing = type(s.indexing).model_validate(
        {**s.indexing.model_dump(), "backend": args.backend, "batch_wait_s": 0.05, **extra}
    )
    embedder = LocalEmbedder(LocalEmbedderSettings())
    async with (
        running_worker(s),
        running(IndexingWorker(s), embedder=SharedEmbedder(embedder)) as indexing,
        running_query(s) as query,
        await MemoryClient.connect(nats_url, app=APP) as client,
    ):
        await asyncio.wait_for(indexing.ready.wait(), 120)
        query.searcher.embedder = SharedEmbedder(embedder)
        last = 0
        for i in range(0, args.events, 50):
            user = USERS[(i // 50) % len(USERS)]
            turns = [
                Event(
                    author=user,
                    message=Message(role="user", parts=[TextPart(text=f"note {j} about {TOPICS[j % len(TOPICS)]}")]),
                )
                for j in range(i, min(i + 50, args.events))
            ]
            last = max(await client.append_many(user, f"s{i // 50}", turns))
        await wait_for(lambda: _indexed_to(indexing, last), timeout=1800, what="the events to be indexed")
        before = (await indexing.live.backend.live()).generation

        outcomes: Counter[str] = Counter()
        errors: list[str] = []
        done = asyncio.Event()

        async def search_all_along() -> None:
            n = 0
            while not done.is_set():
                n += 1
                try:
                    found = await client.search(USERS[n % len(USERS)], QUERIES[n % len(QUERIES)], k=5)
                    outcomes["answers" if found.results else "empty"] += 1
                except Exception as exc:  # noqa: BLE001 - every error is what is measured
                    outcomes["errors"] += 1
                    errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(args.every_ms / 1000)

        searching = asyncio.create_task(search_all_along())
        own = open_backend(s)
        await own.open()
        engine = create_engine(s.database_url())
        try:
            started = time.monotonic()
            result = await rebuild(
                s, indexing.nc, make_indexer(s, own, SharedEmbedder(embedder), indexing.live.js, engine=engine)
            )
            took = time.monotonic() - started
            await asyncio.sleep(args.after_s)
        finally:
            done.set()
            await searching
            await own.close()
            await engine.dispose()
        return {
            "backend": args.backend,
            "events": args.events,
            "every_ms": args.every_ms,
            "rebuild_s": round(took, 1),
            "switched": f"{before} -> {result.generation}",
            **{k: outcomes[k] for k in ("answers", "empty", "errors")},
            "first_errors": errors[:3],
        }


async def _indexed_to(worker: IndexingWorker, seq: int) -> bool:
    info = await worker.live.js.consumer_info(worker.settings.streams.events, worker.settings.indexing.durable)
    return info.ack_floor.stream_seq >= seq


def print_figures(figures: dict) -> None:
    table = Table(title=f"searches every {figures['every_ms']:g} ms while the index is rebuilt and switched")
    for column in ("backend", "events", "rebuild s", "generation", "answers", "empty", "errors"):
        table.add_column(column, justify="left" if column in ("backend", "generation") else "right")
    table.add_row(
        figures["backend"],
        f"{figures['events']:,}",
        f"{figures['rebuild_s']:.1f}",
        figures["switched"],
        *(str(figures[k]) for k in ("answers", "empty", "errors")),
    )
    console.print(table)
    for error in figures["first_errors"]:
        status(f"[red]{escape(error)}[/]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["embedded", "weaviate"], default="embedded")
    p.add_argument("--events", type=int, default=1000)
    p.add_argument("--every-ms", type=float, default=50.0)
    p.add_argument("--after-s", type=float, default=3.0, help="searches go on this long after the switch")
    p.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    args = p.parse_args()
    machine = machine_info()
    warn_if_busy(machine)
    with tempfile.TemporaryDirectory() as tmp, NatsServer() as nats:
        if args.backend == "weaviate":
            with Weaviate() as weaviate:
                figures = asyncio.run(measure(args, nats.url, Path(tmp), weaviate))
        else:
            figures = asyncio.run(measure(args, nats.url, Path(tmp), None))
    print_figures(figures)
    config = {"backend": args.backend, "events": args.events, "every_ms": args.every_ms, "after_s": args.after_s}
    write_json(args.json, "rebuild_blip", machine, config=config, results=figures)


if __name__ == "__main__":
    main()
