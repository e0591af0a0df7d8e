"""What indexing bigrams of unspaced scripts costs the embedded index (issue 29).

Usage::

    .venv/bin/python tests/run_bench.py grams_cost [--docs 5000] [--json PATH]

Builds two keyword-only embedded indexes of the same docs, one generation
as memq made them before issue 29 (no grams column) and one as now, and
reports each file's size and the p50 of keyword searches for a word of each
doc, for an English corpus (LoCoMo-like sentences: no grams, so the cost is
the empty column) and a Chinese one (sentences of 20-60 common Han
characters drawn at random: every character is in two bigrams). The
pre-issue-29 index cannot find the Chinese words at all; its time is shown
to size the difference, not as an alternative.
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
from pathlib import Path

from memq.workers.index.backends import embedded
from memq.workers.index.backends.embedded import EmbeddedIndex
from memq.workers.memory.recall import Doc, SearchQuery, search_text

WORDS = (
    "we went hiking last weekend and the weather was great my sister painted a sunset over the lake "
    "I started a new job at the bakery downtown our dog loves running on the beach the kids made "
    "pottery at camp she is researching adoption agencies for her family"
).split()
HAN = [chr(c) for c in range(0x4E00, 0x4E00 + 2500)]


def english(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 25)))


def chinese(rng: random.Random) -> str:
    return "".join(rng.choice(HAN) for _ in range(rng.randint(20, 60)))


async def measure(path: Path, texts: list[str], queries: list[str], grams: bool) -> dict:
    index = EmbeddedIndex(path)
    await index.open()
    schema = embedded.generation_schema
    try:
        if not grams:
            embedded.generation_schema = lambda n, grams: schema(n, False)  # type: ignore[assignment]
        gen = await index.create_generation("none", 0)
        embedded.generation_schema = schema  # type: ignore[assignment]
        await index.promote(gen.generation)
        docs = [
            Doc(f"e{i}", "app", "u", f"s{i // 50}", i, "user", "user", 1.7e9 + i, t, search_text("user", t, None))
            for i, t in enumerate(texts)
        ]
        await index.upsert(docs)
        times, found = [], 0
        for text in queries:
            t0 = time.perf_counter()
            hits = await index.search(SearchQuery("app", "u", text, "keyword", 10))
            times.append((time.perf_counter() - t0) * 1000)
            found += bool(hits)
    finally:
        embedded.generation_schema = schema  # type: ignore[assignment]
        await index.close()
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return {"bytes": size, "search_p50_ms": statistics.median(times), "queries_found": found / len(queries)}


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(29)
    out = {}
    with tempfile.TemporaryDirectory(prefix="memq-grams-") as tmp:
        for corpus, make in (("english", english), ("chinese", chinese)):
            texts = [make(rng) for _ in range(args.docs)]
            # A word of a random doc: an English word, or two to four Han characters from inside it.
            queries = []
            for _ in range(200):
                t = rng.choice(texts)
                if corpus == "english":
                    queries.append(rng.choice(t.split()))
                else:
                    n = rng.randint(2, 4)
                    at = rng.randrange(len(t) - n)
                    queries.append(t[at : at + n])
            for grams in (False, True):
                name = f"{corpus}-{'grams' if grams else 'before'}"
                out[name] = await measure(Path(tmp) / f"{name}.db", texts, queries, grams)
                print(name, out[name])
    for corpus in ("english", "chinese"):
        before, after = out[f"{corpus}-before"], out[f"{corpus}-grams"]
        print(
            f"{corpus}: size x{after['bytes'] / before['bytes']:.2f}, "
            f"search p50 {before['search_p50_ms']:.2f} -> {after['search_p50_ms']:.2f} ms, "
            f"found {before['queries_found']:.0%} -> {after['queries_found']:.0%}"
        )
    if args.json:
        args.json.write_text(json.dumps({"docs": args.docs, "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--json", type=Path)
    sys.exit(asyncio.run(main(parser.parse_args())))
