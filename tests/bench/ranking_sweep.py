"""Ranking sweep: hybrid recall@10 on LoCoMo for values of one recall setting.

Usage::

    .venv/bin/python tests/run_bench.py ranking_sweep --data ../shared/data/locomo/locomo-dev4.json \\
        --field date_boost --values 0 0.1 0.2 0.3 0.5 1

Builds one embedded index in-process, as the indexing worker would (each
turn with the session's previous one, embedded by the packaged MiniLM), then
asks every question through a :class:`Searcher` once per value of
``recall.<field>``, all other settings at their defaults. Prints recall@10
per category and each conversation's overall, so a choice can be judged by
its curve and by whether every conversation agrees, not by its best point
on the one dev file there is. Quicker than ``retrieval.py`` (no workers, no
Weaviate: the ranking is the same code on both backends); the p50 is the
in-process search, embedding the question included (cached after the first
value, as the query worker caches it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from bench import locomo
from bench.benchlib import console, status
from memq.contracts import queries as qs
from memq.workers.index.backends.embedded import EmbeddedIndex
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.memory.recall import Doc, Turn, search_text
from memq.workers.query.search import Searcher
from memq.workers.settings import LocalEmbedderSettings, RecallSettings, Settings

APP = "locomo"


def docs_of(c: locomo.Conversation) -> list[Doc]:
    """The docs the indexing worker makes of a conversation (context_turns 1)."""
    docs = []
    for session, turns in c.sessions.items():
        for i, t in enumerate(turns):
            previous = Turn(turns[i - 1].speaker, turns[i - 1].text) if i else None
            role = "user" if t.speaker == c.speaker_a else "assistant"
            text = search_text(t.speaker, t.text, t.timestamp, previous)
            docs.append(
                Doc(
                    c.event_id(t.dia_id),
                    APP,
                    c.sample_id,
                    session,
                    len(docs) + 1,
                    t.speaker,
                    role,
                    t.timestamp,
                    t.text,
                    text,
                )
            )
    return docs


async def build(path: Path, conversations, embedder: LocalEmbedder) -> EmbeddedIndex:
    index = EmbeddedIndex(path)
    await index.open()
    gen = await index.create_generation(embedder.model, embedder.dim)
    for c in conversations:
        docs = docs_of(c)
        vectors = await embedder.embed([d.search_text for d in docs])
        await index.upsert([d.with_vector(v) for d, v in zip(docs, vectors, strict=True)], generation=gen.generation)
    await index.promote(gen.generation)
    return index


async def recall_at_10(searcher: Searcher, conversations) -> tuple[dict, dict, float]:
    """(recall@10 by category and overall, overall by conversation, search p50 ms)."""
    by_cat: dict = {}
    by_conv: dict = {}
    latencies = []
    for c in conversations:
        for q in c.questions:
            t0 = time.perf_counter()
            found = await searcher.search(qs.Search(app=APP, user=c.sample_id, query=q.question, mode="hybrid", k=10))
            latencies.append((time.perf_counter() - t0) * 1000)
            wanted = {c.event_id(d) for d in q.evidence}
            got = len(wanted & {r.event_id for r in found.results}) / len(wanted)
            by_cat.setdefault(q.category, []).append(got)
            if q.category in locomo.SCORED:
                by_cat.setdefault("overall", []).append(got)
                by_conv.setdefault(c.sample_id, []).append(got)
    mean = statistics.fmean
    return (
        {k: mean(v) for k, v in by_cat.items()},
        {k: mean(v) for k, v in by_conv.items()},
        statistics.median(latencies),
    )


async def main(args) -> int:
    conversations = locomo.load(args.data)
    field = RecallSettings.model_fields[args.field]
    values = [field.annotation(v) if field.annotation in (int, float) else v for v in args.values]
    embedder = LocalEmbedder(LocalEmbedderSettings())
    with tempfile.TemporaryDirectory(prefix="memq-sweep-") as tmp:
        status(f"indexing {sum(len(c.turns) for c in conversations)} turns …")
        index = await build(Path(tmp) / "index.db", conversations, embedder)
        cats = [*locomo.SCORED, 5, "overall"]
        table = Table(title=f"hybrid recall@10, recall.{args.field} (embedded, in-process)")
        table.add_column(args.field, justify="right")
        for cat in cats:
            table.add_column(
                locomo.CATEGORIES.get(cat, cat) if cat != 5 else "adversarial (not in overall)", justify="right"
            )
        for c in conversations:
            table.add_column(c.sample_id, justify="right")
        table.add_column("p50 ms", justify="right")
        try:
            for value in values:
                status(f"{args.field} = {value} …")
                settings = Settings()
                settings = settings.model_copy(
                    update={"recall": settings.recall.model_copy(update={args.field: value})}
                )
                searcher = Searcher(settings, backend=index, embedder=embedder)
                by_cat, by_conv, p50 = await recall_at_10(searcher, conversations)
                table.add_row(
                    str(value),
                    *(f"{by_cat[c]:.3f}" if c in by_cat else "–" for c in cats),  # a category the file never asks
                    *(f"{by_conv[c.sample_id]:.3f}" for c in conversations),
                    f"{p50:.1f}",
                )
        finally:
            await index.close()
            await embedder.close()
    console.print(table)
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="LoCoMo JSON (e.g. ../shared/data/locomo/locomo-dev4.json)"
    )
    parser.add_argument("--field", required=True, choices=sorted(RecallSettings.model_fields), help="a recall setting")
    parser.add_argument("--values", nargs="+", required=True, help="its values, in order")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
