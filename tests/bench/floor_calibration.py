"""Calibrates ``recall.min_similarity``, the vector side's relevance floor, on LoCoMo.

Usage::

    .venv/bin/python tests/run_bench.py floor_calibration --data ../shared/data/locomo/locomo-dev4.json \
        [--embedder local|e5] [--json PATH]

Every turn is embedded as the indexing worker embeds it (``search_text``:
date, author, the turn and the previous one) and every question as a query
is. For each question that has evidence, the cosine similarity of the
question to each evidence turn is what a floor must keep; the similarity to
turns of *other* conversations (other people, other lives) is what an
unrelated memory scores. For each candidate floor the script prints what it
costs a vector search's recall@10 (evidence among the question's 10 nearest
turns with a similarity below the floor, in recall points over the scored
questions), the share of evidence turns that share no word with their
question (Porter stems, stopwords left out: only the vector side can find
them in a hybrid search) it drops, and the share of unrelated turns it still
lets through; then the highest floor that costs vector recall@10 at most
``--max-loss`` (default 0.003: a third of a point). A hybrid search keeps every
keyword match whatever its similarity, so it loses at most that much.

Each embedder has its own floor (``--embedder``: ``local``, MiniLM, the
default; ``e5``, multilingual-e5-small, whose cosines sit in a narrow high
band): the chosen one goes into ``workers/index/embedders/floors.py``, and
every index generation records its model's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench import locomo
from bench.offline_embedders import KINDS, offline
from memq.workers.index.backends.embedded import STOPWORDS
from memq.workers.index.stems import stems
from memq.workers.memory.recall import Turn, search_text

FLOORS = [round(x, 2) for x in np.arange(0.0, 0.6, 0.02)]
E5_FLOORS = [round(x, 2) for x in np.arange(0.6, 0.92, 0.01)]  # e5's cosines: unrelated pairs near 0.75


def words(text: str) -> set[str]:
    return set(stems(text).split()) - STOPWORDS


def percentiles(sims: np.ndarray, at: list[int]) -> list[float] | str:
    # a file may have no vector-only evidence (or one conversation, no unrelated pairs)
    return np.percentile(sims, at).round(3).tolist() if len(sims) else "none"


def main(args: argparse.Namespace) -> int:
    conversations = locomo.load(args.data)
    embedder = offline(args.embedder)
    floors = E5_FLOORS if args.embedder == "e5" else FLOORS
    per_conv = []
    for c in conversations:
        ids, texts = [], []
        for turns in c.sessions.values():
            for i, t in enumerate(turns):
                previous = Turn(turns[i - 1].speaker, turns[i - 1].text) if i else None
                ids.append(c.event_id(t.dia_id))
                texts.append(search_text(t.speaker, t.text, t.timestamp, previous))
        vectors = embedder.docs(texts)
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        qs = [q for q in c.questions if q.evidence]
        qv = embedder.queries([q.question for q in qs])
        qv = qv / np.linalg.norm(qv, axis=1, keepdims=True)
        per_conv.append((c, ids, texts, vectors, qs, qv))
        print(f"{c.sample_id}: {len(ids)} turns, {len(qs)} questions with evidence", file=sys.stderr)

    evidence, vector_only, unrelated = [], [], []
    top10: list[tuple[list[float], int]] = []  # per scored question: its evidence's sims among its 10 nearest
    for n, (c, ids, texts, vectors, qs, qv) in enumerate(per_conv):
        index = {i: k for k, i in enumerate(ids)}
        others = np.concatenate([v for m, (*_, v, _q, _qv) in enumerate(per_conv) if m != n] or [vectors[:0]])
        for q, v in zip(qs, qv, strict=True):
            asked = words(q.question)
            for d in q.evidence:
                k = index[c.event_id(d)]
                sim = float(vectors[k] @ v)
                evidence.append(sim)
                if not asked & words(texts[k]):
                    vector_only.append(sim)
            sims = vectors @ v
            nearest = set(np.argsort(-sims)[:10].tolist())
            if q.category in locomo.SCORED:
                found = [float(sims[index[c.event_id(d)]]) for d in q.evidence if index[c.event_id(d)] in nearest]
                top10.append((found, len(q.evidence)))
            if len(others):
                unrelated.extend((others @ v).tolist())
    ev, vo, un = np.array(evidence), np.array(vector_only), np.array(unrelated)
    rows = []
    for f in floors:
        cost = sum(sum(s < f for s in found) / n for found, n in top10) / len(top10)
        rows.append(
            {
                "floor": f,
                "vector_recall10_cost": float(cost),
                "vector_only_lost": float((vo < f).mean()) if len(vo) else 0.0,
                "unrelated_kept": float((un >= f).mean()),
            }
        )
    chosen = max((r for r in rows if r["vector_recall10_cost"] <= args.max_loss), key=lambda r: r["floor"])
    print(f"evidence turns {len(ev)} (vector side only: {len(vo)}); unrelated pairs {len(un)}")
    print("percentiles of similarity, evidence:", percentiles(ev, [1, 5, 25, 50]))
    print("percentiles of similarity, vector-only evidence:", percentiles(vo, [1, 5, 25, 50]))
    print("percentiles of similarity, unrelated:", percentiles(un, [50, 75, 95, 99]))
    print(f"{'floor':>6} {'vector R@10 cost':>17} {'vector-only lost':>17} {'unrelated kept':>15}")
    for r in rows:
        cost, lost, kept = r["vector_recall10_cost"], r["vector_only_lost"], r["unrelated_kept"]
        print(f"{r['floor']:>6.2f} {cost:>17.4f} {lost:>17.3%} {kept:>15.3%}")
    print(f"{embedder.model}: highest floor costing vector recall@10 at most {args.max_loss}: {chosen['floor']}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"embedder": args.embedder, "model": embedder.model, "rows": rows, "chosen": chosen["floor"]}, indent=1
            )
        )
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--max-loss", type=float, default=0.003, help="vector recall@10 a floor may cost")
    parser.add_argument("--embedder", choices=KINDS, default="local", help="local: MiniLM; e5: multilingual-e5-small")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(main(parse_args()))
