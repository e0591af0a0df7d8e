"""Weaviate scoping benchmark: per-user isolation by filter vs by tenant.

Usage::

    .venv/bin/python tests/run_bench.py weaviate_scoping [--quick | --smoke] [--json PATH]

One Weaviate server (``tests/services.py``, the pinned build from
``infra/scripts/install-weaviate.sh``) on loopback, and two index generations
in it through :class:`~memq.workers.index.backends.weaviate.WeaviateIndex`:
``scoping="filter"`` (one shard, ``user_key`` filter on every query) and
``scoping="tenant"`` (one tenant per user). Both get the same data, and every
measurement alternates between them (filter, tenant, filter, …), so a slow
moment of a shared machine hits both alike; the table shows medians and the
ratio tenant/filter from this one run.

**Data.** ``users`` × ``docs`` (full 200 × 200, ``--quick`` 50 × 100) docs of
one app, 384-dim random unit vectors, 8–30 words drawn Zipf-like from 3,000
made-up words. **Import**: all docs shuffled across users (as the stream
interleaves them) and upserted in batches of 64 (the indexer's default
batch size), one batch at a time; docs/s = docs ÷ summed batch time, plus the
median batch time. **Search** (one requester, k = 10): a random user, two
random words, a random unit vector; keyword (BM25), vector, hybrid (alpha 0.5,
relative score); ``queries`` each (full 300, ``--quick`` 100), p50 and p99 in
ms. Every hit is checked to belong to the queried user. **Delete**: a user's
docs removed as the indexer does it (``before_seq`` given: a filtered delete,
inside the tenant for ``tenant``) and without ``before_seq`` (which drops
the whole tenant for ``tenant``); ``deletes`` users each (full 20,
``--quick`` 5), median ms. **Disk**: bytes under each collection's directory
right after the import (memtables not yet flushed are in the WAL, so counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import services
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, status, warn_if_busy
from memq.workers.index.backends.weaviate import WeaviateIndex
from memq.workers.memory.recall import Doc, SearchQuery, search_text
from memq.workers.settings import WeaviateSettings

MODES = ("filter", "tenant")
DIM = 384
BATCH = 64
APP = "bench"


@dataclass
class Config:
    users: int
    docs: int
    queries: int
    deletes: int


FULL = Config(users=200, docs=200, queries=300, deletes=20)
QUICK = Config(users=50, docs=100, queries=100, deletes=5)
SMOKE = Config(users=4, docs=10, queries=5, deletes=2)  # the test suite's run: it works, no figures


def make_docs(cfg: Config, rng: random.Random) -> tuple[list[Doc], list[str], np.ndarray]:
    nrng = np.random.default_rng(rng.randrange(2**32))
    vocab = [f"{''.join(rng.choices('bcdfghklmnprstvz', k=2))}{rng.choice('aeiou')}{i}" for i in range(3000)]
    weights = 1 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    n = cfg.users * cfg.docs
    vectors = nrng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs, seq = [], 0
    for u in range(cfg.users):
        for i in range(cfg.docs):
            seq += 1
            words = nrng.choice(len(vocab), size=int(nrng.integers(8, 31)), p=weights)
            text = " ".join(vocab[w] for w in words)
            author, ts = ("user", "assistant")[i % 2], 1_700_000_000.0 + seq
            docs.append(
                Doc(
                    id=f"ev-{seq}",
                    app=APP,
                    user=f"user-{u}",
                    session=f"s{i // 50}",
                    seq=seq,
                    author=author,
                    role=author,
                    timestamp=ts,
                    text=text,
                    search_text=search_text(author, text, ts),
                    vector=vectors[seq - 1].tolist(),
                )
            )
    return docs, vocab, weights


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def ms(values: list[float]) -> dict:
    return {"p50_ms": percentile(values, 50) * 1e3, "p99_ms": percentile(values, 99) * 1e3, "n": len(values)}


async def run(cfg: Config, server: services.Weaviate, rng: random.Random) -> dict:
    docs, vocab, weights = make_docs(cfg, rng)
    status(f"{len(docs):,} docs of {cfg.users} users made")
    tag = uuid.uuid4().hex[:6]
    settings = {
        m: WeaviateSettings(url=server.url, grpc_port=server.grpc_port, collection=f"Bench{m.title()}{tag}", scoping=m)
        for m in MODES
    }
    index = {m: WeaviateIndex(s) for m, s in settings.items()}
    gens = {}
    for m, idx in index.items():
        await idx.open()
        gens[m] = (await idx.create_generation("bench:random", DIM)).generation
        await idx.promote(gens[m])

    # import, batches alternating between the modes
    shuffled = docs[:]
    rng.shuffle(shuffled)
    batch_s = {m: [] for m in MODES}
    for i in range(0, len(shuffled), BATCH):
        batch = shuffled[i : i + BATCH]
        for m in MODES if (i // BATCH) % 2 == 0 else MODES[::-1]:
            t = time.perf_counter()
            await index[m].upsert(batch)
            batch_s[m].append(time.perf_counter() - t)
    result: dict = {"import": {}, "search": {}, "delete": {}, "disk": {}}
    for m in MODES:
        assert await index[m].count() == len(docs), m
        result["import"][m] = {
            "docs_per_s": len(docs) / sum(batch_s[m]),
            "batch_p50_ms": statistics.median(batch_s[m]) * 1e3,
            "seconds": sum(batch_s[m]),
        }
        result["disk"][m] = disk_bytes(server.dir / "data" / gens[m].lower())
    status("imported: " + ", ".join(f"{m} {result['import'][m]['docs_per_s']:,.0f} docs/s" for m in MODES))

    # search, one requester, the same query against each mode in turn
    nrng = np.random.default_rng(rng.randrange(2**32))
    for kind in ("keyword", "vector", "hybrid"):
        times = {m: [] for m in MODES}
        for q in range(cfg.queries):
            vec = nrng.standard_normal(DIM)
            vec = (vec / np.linalg.norm(vec)).tolist()
            words = " ".join(vocab[w] for w in nrng.choice(len(vocab), size=2, p=weights))
            query = SearchQuery(
                app=APP, user=f"user-{rng.randrange(cfg.users)}", text=words, mode=kind, vector=vec, k=10
            )
            for m in MODES if q % 2 == 0 else MODES[::-1]:
                t = time.perf_counter()
                hits = await index[m].search(query)
                times[m].append(time.perf_counter() - t)
                assert all(query.matches(h.doc) for h in hits), (m, query)
                assert kind == "keyword" or len(hits) == 10, (m, kind, len(hits))
        result["search"][kind] = {m: ms(times[m]) for m in MODES}
        status(f"search {kind}: " + ", ".join(f"{m} p50 {result['search'][kind][m]['p50_ms']:.2f} ms" for m in MODES))

    # deletes of distinct users: as the indexer does it (before_seq), then without
    victims = rng.sample(range(cfg.users), 2 * cfg.deletes)
    for name, users, before in (
        ("before_seq", victims[: cfg.deletes], 10**12),
        ("whole_user", victims[cfg.deletes :], None),
    ):
        times = {m: [] for m in MODES}
        for j, u in enumerate(users):
            for m in MODES if j % 2 == 0 else MODES[::-1]:
                t = time.perf_counter()
                await index[m].delete_user(APP, f"user-{u}", before_seq=before)
                times[m].append(time.perf_counter() - t)
                assert await index[m].count(app=APP, user=f"user-{u}") == 0, (m, u)
        result["delete"][name] = {m: {"p50_ms": statistics.median(times[m]) * 1e3, "n": len(times[m])} for m in MODES}
    for m, idx in index.items():
        await idx.client.alias.delete(alias_name=idx.alias)
        await idx.client.collections.delete(gens[m])
        await idx.close()
    return result


def rows(result: dict) -> list[tuple[str, str, float, float, bool]]:
    """(what, unit, filter, tenant, higher is better)."""
    out = [("import", "docs/s", *(result["import"][m]["docs_per_s"] for m in MODES), True)]
    out.append(("import batch of 64 p50", "ms", *(result["import"][m]["batch_p50_ms"] for m in MODES), False))
    for kind, by_mode in result["search"].items():
        for q in ("p50", "p99"):
            out.append((f"search {kind} {q}", "ms", *(by_mode[m][f"{q}_ms"] for m in MODES), False))
    for name, by_mode in result["delete"].items():
        out.append((f"delete user ({name}) p50", "ms", *(by_mode[m]["p50_ms"] for m in MODES), False))
    out.append(("disk after import", "MB", *(result["disk"][m] / 1e6 for m in MODES), False))
    return out


def print_table(cfg: Config, result: dict) -> None:
    table = Table(title=f"Weaviate scoping: {cfg.users} users × {cfg.docs} docs, dim {DIM}, k 10 (medians, one run)")
    for col in ("", "unit", "filter", "tenant", "tenant/filter", "better"):
        table.add_column(col, justify="left" if col in ("", "unit", "better") else "right")
    for what, unit, f, t, higher in rows(result):
        ratio = t / f if f else float("nan")
        better = (
            "tenant"
            if (ratio > 1) == higher and abs(ratio - 1) > 0.05
            else "filter"
            if abs(ratio - 1) > 0.05
            else "same"
        )
        table.add_row(what, unit, f"{f:,.2f}", f"{t:,.2f}", f"{ratio:.2f}", better)
    console.print(table)


async def main(mode: str, json_path: Path | None) -> int:
    cfg = {"full": FULL, "quick": QUICK, "smoke": SMOKE}[mode]
    machine = machine_info()
    status(f"[bold]memq Weaviate scoping benchmark[/] — {mode} run")
    warn_if_busy(machine)
    rng = random.Random(42)
    with tempfile.TemporaryDirectory(prefix="memq-bench-weaviate-") as tmp:
        started = time.perf_counter()
        with services.Weaviate(workdir=tmp) as server:
            machine["weaviate_start_s"] = round(time.perf_counter() - started, 2)
            machine["weaviate"] = services.WEAVIATE_VERSION
            status(f"Weaviate {services.WEAVIATE_VERSION} ready in {machine['weaviate_start_s']} s")
            result = await run(cfg, server, rng)
    print_table(cfg, result)
    if json_path:
        data = {
            "benchmark": "weaviate_scoping",
            "mode": mode,
            "machine": machine,
            "config": {**asdict(cfg), "dim": DIM, "batch": BATCH, "k": 10, "alpha": 0.5},
            "results": result,
            "ratios_tenant_over_filter": {what: t / f if f else None for what, _, f, t, _ in rows(result)},
        }
        json_path.write_text(json.dumps(data, indent=2) + "\n")
        status(f"results written to {json_path}")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks it works")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    sys.exit(asyncio.run(main("smoke" if args.smoke else "quick" if args.quick else "full", args.json)))
