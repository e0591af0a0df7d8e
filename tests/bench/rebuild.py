"""Rebuild benchmark: events/s of ``memq index rebuild`` with N indexing replicas,
beside the raw embedder in the same run (issue 32).

Usage::

    .venv/bin/python tests/run_bench.py rebuild [--quick] [--json PATH]
        [--replicas 1 2] [--events N] [--threads-per-replica T]

The many-core form (a lent machine; an embedder per replica, each with
cores / N ONNX threads)::

    .venv/bin/python tests/run_bench.py rebuild --replicas 1 2 4 8 --events 20000 --json rebuild.json

Everything runs on loopback, on a nats-server this script starts, with the
embedded index in a temporary directory and the local embedder. E events
(``--events``; 3,000, ``--quick`` 400) of about 40 words each are published
across 20 sessions. Indexing runs with ``context_turns = 0`` (no SQL: the
rebuild replays the stream only), at the live path's batch size (64).

- **raw embedder**: this process embeds the texts a rebuild embeds (each
  doc's search text: its date and author, then the words) with the local
  embedder, in batches of 64 as the indexing worker does (``LocalEmbedder``,
  its threads: one per core, or ``--threads-per-replica``): the ceiling a
  replica's rebuild can reach on its own. It runs before and after each
  rebuild, and a rebuild's "× raw" is against the mean of the two raw runs
  beside it (the load of a shared machine drifts).
- **rebuild, N replicas**: N ``memq worker indexing`` processes (each with
  its own embedder, ``cores / N`` ONNX threads unless
  ``--threads-per-replica``) on an index whose live generation is empty and
  whose live consumer starts at the stream's end (so the workers do nothing
  but the rebuild); this process runs the rebuild as ``memq index rebuild
  --no-pull`` does, and times it from the start to the switch. Each
  replica's share (docs it embedded, from the job record) is in the table;
  afterwards the live generation must hold exactly E docs.

The machine's load before the run is printed (``cpu_busy_at_start``), and
each row says how much of the machine's cores other processes took while
it ran ("others' load", from ``/proc``): they slow every figure down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
import services
from rich.table import Table

from bench.benchlib import console, cpu_busy, machine_info, process_cpu, status, warn_if_busy
from bench.fleet import Replica
from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, EventAppended, Message, TextPart
from memq.contracts.subjects import EVENTS_WILDCARD
from memq.workers.index.backends import open_backend
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.indexer import Indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.memory.recall import doc_for
from memq.workers.runtime import bus
from memq.workers.settings import LocalEmbedderSettings, Settings

BATCH = 64  # the live path's batch (indexing.batch_size's default)
SESSIONS = 20
WORDS = (
    "the agent remembers what the user said about travel plans budgets favourite places "
    "dinner with friends the new job a sister's wedding and the books on the shelf"
).split()


@dataclass
class Row:
    run: str
    replicas: int
    events: int
    seconds: float
    events_per_s: float
    ratio_to_raw: float = 0.0
    docs_per_replica: list[int] = field(default_factory=list)
    others_load: float = 0.0  # share of the machine's cores other processes used during the run
    exactly_once: bool = True


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(40)) + f" (turn {i})"


def event(i: int) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=sentence(i))]))


def search_texts(n: int) -> list[str]:
    """What a rebuild embeds for the events: each doc's search text (its
    date and author before the words), as the indexer makes it."""
    texts = []
    for i in range(n):
        message = EventAppended(app="bench", user="u", session=f"s{i % SESSIONS}", event=event(i))
        doc = doc_for(i + 1, message, "all", None)
        assert doc is not None
        texts.append(doc.search_text)
    return texts


def settings_for(nats_url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        nats={"url": nats_url},
        database={"url": f"sqlite+aiosqlite:///{data_dir / 'memq.db'}"},
        indexing={"context_turns": 0, "batch_size": BATCH, "ack_wait_s": 60},
    )


def worker_env(settings: Settings, threads: int) -> dict[str, str]:
    return {
        "MEMQ_INDEXING__CONTEXT_TURNS": "0",
        "MEMQ_INDEXING__BATCH_SIZE": str(BATCH),
        "MEMQ_INDEXING__ACK_WAIT_S": "60",
        "MEMQ_INDEXING__LOCAL__THREADS": str(threads),
        "MEMQ_LOG_LEVEL": "WARNING",
    }


async def publish(settings: Settings, n: int) -> None:
    nc = await nats.connect(settings.nats.url)
    try:
        await bus.ensure_streams(nc.jetstream(), settings.streams)
    finally:
        await nc.close()
    async with await MemoryClient.connect(settings.nats.url, app="bench") as client:
        for s in range(SESSIONS):
            events = [event(i) for i in range(s, n, SESSIONS)]
            for k in range(0, len(events), 500):
                await client.append_many("u", f"s{s}", events[k : k + 500])


async def raw_embedder(n: int, threads: int, when: str, ours: set[int]) -> Row:
    status(f"raw embedder, run {when} …")
    embedder = LocalEmbedder(LocalEmbedderSettings(threads=threads))
    texts = search_texts(n)
    await embedder.embed(texts[:BATCH])  # load and warm up
    before = process_cpu()
    t0 = time.perf_counter()
    for k in range(0, n, BATCH):
        await embedder.embed(texts[k : k + BATCH])
    seconds = time.perf_counter() - t0
    await embedder.close()
    load = others_load(before, process_cpu(), ours, seconds)
    return Row(f"raw embedder, run {when} (this process)", 0, n, seconds, n / seconds, others_load=load)


async def prepare_index(settings: Settings) -> None:
    """An empty live generation of the local model and a live consumer at
    the stream's end: the workers start ready and do nothing but the rebuild."""
    embedder = LocalEmbedder(LocalEmbedderSettings())
    backend = open_backend(settings)
    await backend.open()
    nc = await nats.connect(settings.nats.url)
    try:
        js = nc.jetstream()
        if await backend.live() is None:
            gen = await backend.create_generation(embedder.model, embedder.dim)
            await backend.promote(gen.generation)
        last = (await js.stream_info(settings.streams.events)).state.last_seq
        config = IndexingWorker(settings).consumer_config(start_seq=last + 1)
        config.name, config.filter_subject = config.durable_name, EVENTS_WILDCARD
        await js.add_consumer(settings.streams.events, config)
    finally:
        await nc.close()
        await backend.close()
        await embedder.close()


async def rebuild_with(settings: Settings, n: int, replicas: int, threads: int, log_dir: Path, ours: set[int]) -> Row:
    env = worker_env(settings, threads)
    workers = [Replica(settings, "indexing", i, env, log_dir).start() for i in range(replicas)]
    try:
        for w in workers:
            await asyncio.to_thread(w.wait_ready, 180)
        embedder = LocalEmbedder(LocalEmbedderSettings())  # only its model name: this process does not pull
        backend = open_backend(settings)
        await backend.open()
        nc = await nats.connect(settings.nats.url)
        try:
            indexer = Indexer(backend, embedder, max_message_bytes=settings.streams.max_message_bytes)
            before = process_cpu()
            t0 = time.perf_counter()
            result = await rebuild(settings, nc, indexer, work=False)
            seconds = time.perf_counter() - t0
            load = others_load(before, process_cpu(), ours | {w.pid for w in workers}, seconds)
            count = await backend.count()
        finally:
            await nc.close()
            await backend.close()
            await embedder.close()
    finally:
        for w in workers:
            w.stop(10)
    shares = sorted((s.docs for s in result.shares), reverse=True)
    shares += [0] * (replicas - len(shares))
    return Row(
        f"rebuild, {replicas} indexing replica{'s' if replicas > 1 else ''}",
        replicas,
        n,
        seconds,
        n / seconds,
        docs_per_replica=shares,
        others_load=load,
        exactly_once=count == n and result.docs == n,
    )


def others_load(before: dict, after: dict, ours: set[int], seconds: float) -> float:
    """The share of the machine's cores that processes other than ``ours``
    (this script, its workers, its nats-server) used over ``seconds``."""
    spent = sum(cpu - before.get(pid, (name, 0.0))[1] for pid, (name, cpu) in after.items() if pid not in ours)
    return round(max(spent, 0.0) / (seconds * len(os.sched_getaffinity(0))), 3)


def print_results(machine: dict, rows: list[Row]) -> None:
    table = Table(
        title=f"index rebuild, local embedder, embedded index ({machine['nproc']} cores, "
        f"{machine['cpu_busy_at_start']:.0%} busy before the run; × raw: a rebuild against the raw runs "
        "before and after it, a raw run against all of them)"
    )
    for column in ("run", "events", "s", "events/s", "× raw", "docs per replica", "others' load", "exactly once"):
        table.add_column(column, justify="left" if column in ("run", "docs per replica") else "right")
    for r in rows:
        table.add_row(
            r.run,
            f"{r.events:,}",
            f"{r.seconds:.1f}",
            f"{r.events_per_s:.0f}",
            f"{r.ratio_to_raw:.2f}",
            " / ".join(map(str, r.docs_per_replica)) or "—",
            f"{r.others_load:.0%}",
            "yes" if r.exactly_once else "NO",
        )
    console.print(table)


async def main(args: argparse.Namespace) -> int:
    n = args.events or (400 if args.quick else 3000)
    cores = len(os.sched_getaffinity(0))
    machine = machine_info()
    status(f"[bold]memq rebuild benchmark[/] — {'quick' if args.quick else 'full'} run, {n} events")
    warn_if_busy(machine)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="memq-bench-rebuild-") as tmp, services.NatsServer() as server:
        settings = settings_for(server.url, Path(tmp))
        status("publishing …")
        await publish(settings, n)
        await prepare_index(settings)
        ours = {os.getpid(), server.pid}
        # The raw embedder runs before and after each rebuild: on a shared
        # machine the load drifts, and each rebuild is compared with the
        # mean of the two raw runs beside it.
        raw = [await raw_embedder(n, args.threads_per_replica or 0, "1", ours)]
        for replicas in args.replicas:
            threads = args.threads_per_replica or max(1, cores // replicas)
            status(f"rebuild with {replicas} replica(s), {threads} ONNX thread(s) each …")
            row = await rebuild_with(settings, n, replicas, threads, Path(tmp), ours)
            raw.append(await raw_embedder(n, args.threads_per_replica or 0, str(len(raw) + 1), ours))
            row.ratio_to_raw = 2 * row.events_per_s / (raw[-2].events_per_s + raw[-1].events_per_s)
            rows += [raw[-2], row]
        rows.append(raw[-1])
        mean = sum(r.events_per_s for r in raw) / len(raw)
        for r in raw:
            r.ratio_to_raw = r.events_per_s / mean
    machine["cpu_busy_at_end"] = cpu_busy()
    print_results(machine, rows)
    if args.json:
        data = {
            "benchmark": "rebuild",
            "mode": "quick" if args.quick else "full",
            "machine": machine,
            "config": {"events": n, "batch_size": BATCH, "replicas": args.replicas, "context_turns": 0},
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        status(f"results written to {args.json}")
    return 0 if all(r.exactly_once for r in rows) else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (400 events)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], metavar="N", help="replica counts (1 2)")
    parser.add_argument("--events", type=int, metavar="N", help="events to rebuild (3,000; quick 400)")
    parser.add_argument(
        "--threads-per-replica", type=int, default=0, metavar="T", help="ONNX threads per replica (cores / N)"
    )
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
