"""How the context's budget split between recall, summary and window decides
how much evidence it holds: the measurement behind ``Strategy.recall_share``.

Usage::

    # replay once (the "summary_buffer + recall" configuration of
    # tests/bench/context.py) and keep every question's assembly inputs
    .venv/bin/python tests/run_bench.py context_split capture --data ../shared/data/locomo/locomo-dev4.json \\
        --budget 2000 --out /tmp/split.pkl
    # then sweep the split offline (about a minute), as a curve and by
    # leave-one-conversation-out
    .venv/bin/python tests/run_bench.py context_split sweep --inputs /tmp/split.pkl --tolerance 0.02 \\
        --json context_split.json

``capture`` asks every question with ``recall_limit`` = ``--candidates`` so
that the recorded recall candidates cover every split the sweep tries; the
query worker's :func:`~memq.workers.memory.context.assemble` is wrapped to
record its inputs (window, summary, candidates) as the worker computed them.
``sweep`` re-assembles each recorded context under each split and scores it
as tests/bench/context.py does (evidence in the window, among the recalled
memories, or verbatim in the summary), checking the budget every time.
Leave-one-conversation-out picks, on the other conversations, the least
recall (smallest share, then fewest memories) whose evidence is within
``--tolerance`` of the best there, and scores it on the one left out: the
benchmark only asks about the past, so the largest share always looks best
on it, while an agent's own conversation needs the room too. ``sweep`` prints
the curve as a table and, with ``--json PATH``, writes every policy's
evidence and each fold's pick there.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import pickle
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

from bench import context as context_bench
from bench import locomo
from bench.benchlib import console, machine_info, status, write_json
from memq.workers.memory import context as ctxmod
from memq.workers.query import ops

CONFIG = next(c for c in context_bench.CONFIGS if c.recall)
SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
LIMITS = (5, 10, 15, 20, 30, 40)


@dataclasses.dataclass
class Case:
    """One question's recorded assembly inputs and what it needs."""

    conversation: str
    category: int
    wanted: list[str]  # evidence event ids
    texts: dict[str, str]  # evidence id -> turn text (for the summary rule)
    inputs: dict[str, Any]  # assemble()'s keyword arguments


async def _capture(client, conversations, config, budget, result, max_q, *, candidates: int, cases: list[Case]):
    recorded: list[dict[str, Any]] = []
    real = ops.assemble

    def recording(**kwargs: Any):
        recorded.append(kwargs)
        return real(**kwargs)

    ops.assemble = recording  # the query worker runs in this process
    try:
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for c in conversations:
            text_of = {c.event_id(t.dia_id): t.text for t in c.turns}
            for q in c.questions[:max_q]:
                if q.category not in locomo.SCORED:
                    continue
                recorded.clear()
                await client.context(
                    c.sample_id,
                    context_bench.SESSION,
                    strategy={"kind": config.strategy, "budget": budget},
                    recall_limit=candidates,
                    message=q.question,
                )
                # a repeated question is answered from the query cache
                kwargs = dict(recorded[0]) if recorded else seen[(c.sample_id, q.question)]
                seen[(c.sample_id, q.question)] = kwargs
                wanted = [c.event_id(d) for d in q.evidence]
                cases.append(Case(c.sample_id, q.category, wanted, {e: text_of[e] for e in wanted}, kwargs))
    finally:
        ops.assemble = real


async def capture(args) -> int:
    conversations = locomo.load(args.data, limit=1 if args.quick else None)
    cases: list[Case] = []

    async def scorer(client, convs, config, budget, result, max_q):
        await _capture(client, convs, config, budget, result, max_q, candidates=args.candidates, cases=cases)

    with tempfile.TemporaryDirectory(prefix="memq-split-") as tmp:
        status(f"capturing {len(conversations)} conversations, budget {args.budget}")
        await context_bench.run_config(
            CONFIG, conversations, args.budget, Path(tmp), None, 60 if args.quick else None, scorer=scorer
        )
    args.out.write_bytes(pickle.dumps({"budget": args.budget, "cases": cases}))
    status(f"{len(cases)} questions written to {args.out}")
    return 0


def evidence(case: Case, policy: dict[str, Any]) -> tuple[float, int, int]:
    """(evidence fraction, total tokens, recalled count) of ``case`` under ``policy``."""
    inputs = dict(case.inputs)
    inputs["strategy"] = dataclasses.replace(inputs["strategy"], recall_share=policy["recall_share"])
    inputs["recall_limit"] = policy["recall_limit"]
    built = ctxmod.assemble(**inputs)
    held = {built.events[it.seq].get("id") for it in built.window} | {e.get("id") for _, e in built.recalled}
    summary = built.summary or ""
    got = sum(context_bench.present(case.texts[e], e, held, summary) for e in case.wanted) / len(case.wanted)
    return got, built.tokens.total, len(built.recalled)


def score_policy(cases: list[Case], policy: dict[str, Any], budget: int) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    over = 0
    for case in cases:
        got, total, _ = evidence(case, policy)
        over += total > budget
        for key in (str(case.category), "overall"):
            per.setdefault(key, []).append(got)
    out = {k: statistics.fmean(v) for k, v in per.items()}
    out["over"] = over
    return out


def sweep(args) -> int:
    machine = machine_info()
    data = pickle.loads(args.inputs.read_bytes())
    cases: list[Case] = data["cases"]
    budget = data["budget"]
    shares = tuple(float(s) for s in args.shares)
    limits = tuple(int(n) for n in args.limits)
    convs = sorted({c.conversation for c in cases})
    status(f"{len(cases)} questions, {len(convs)} conversations, budget {budget}")
    policies = [{"recall_share": s, "recall_limit": n} for s, n in itertools.product(shares, limits)]
    # scores[conversation][policy index] -> (sum, count), so that folds are cheap
    by_conv: dict[str, list[Case]] = {c: [k for k in cases if k.conversation == c] for c in convs}
    sums: dict[str, list[float]] = {c: [] for c in convs}
    over: list[int] = []
    table = Table(
        title=f"evidence held at a {budget}-token budget, by recall share (rows) x memories at most (columns)"
    )
    table.add_column("share")
    for n in limits:
        table.add_column(f"≤{n}", justify="right")
    results: dict[tuple[float, int], dict[str, float]] = {}
    for policy in policies:
        o = 0
        for conv in convs:
            got = [evidence(k, policy) for k in by_conv[conv]]
            sums[conv].append(sum(g for g, _, _ in got))
            o += sum(t > budget for _, t, _ in got)
        over.append(o)
    n_total = len(cases)
    for i, policy in enumerate(policies):
        overall = sum(sums[c][i] for c in convs) / n_total
        results[(policy["recall_share"], policy["recall_limit"])] = {"overall": overall, "over": over[i]}
    for s in shares:
        table.add_row(
            f"{s:.2f}",
            *[f"{results[(s, n)]['overall']:.3f}" + ("!" if results[(s, n)]["over"] else "") for n in limits],
        )
    console.print(table)
    # leave one conversation out: pick the best policy on the other three,
    # score it on the held-out one
    held_out = []
    for conv in convs if len(convs) > 1 else ():
        train = [c for c in convs if c != conv]
        n_train = sum(len(by_conv[c]) for c in train)
        train_score = [sum(sums[c][i] for c in train) / n_train for i in range(len(policies))]
        # the least recall (share, then count) within --tolerance of the best:
        # the rest of the budget stays with the conversation itself
        top = max(train_score)
        best = next(i for i in range(len(policies)) if train_score[i] >= top - args.tolerance)
        score = sums[conv][best] / len(by_conv[conv])
        held_out.append((conv, policies[best], score, len(by_conv[conv])))
        console.print(f"held out {conv}: picked {policies[best]} on the others -> {score:.3f} on it")
    loco = sum(s * n for _, _, s, n in held_out) / n_total if held_out else None
    if loco is not None:
        console.print(f"leave-one-conversation-out evidence: {loco:.3f}")
    if any(over):
        console.print(f"[red]over budget in {sum(1 for o in over if o)} policies[/]")
    write_json(
        args.json,
        "context_split",
        machine,
        config={"budget": budget, "questions": n_total, "conversations": len(convs), "tolerance": args.tolerance},
        rows=[
            {
                "policy": f"share={s},limit={n}",
                "recall_share": s,
                "recall_limit": n,
                "evidence": r["overall"],
                "over_budget": r["over"],
            }
            for (s, n), r in results.items()
        ],
        held_out=[
            {"conversation": conv, "picked": policy, "evidence": score, "questions": asked}
            for conv, policy, score, asked in held_out
        ],
        leave_one_out_evidence=loco,
    )
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture", help="replay and record every question's assembly inputs")
    cap.add_argument("--data", type=Path, required=True)
    cap.add_argument("--budget", type=int, default=2000)
    cap.add_argument("--candidates", type=int, default=40, help="recall_limit asked (default 40)")
    cap.add_argument("--quick", action="store_true", help="one conversation, 60 questions")
    cap.add_argument("--out", type=Path, required=True)
    sw = sub.add_parser("sweep", help="score recorded inputs under each split")
    sw.add_argument("--inputs", type=Path, required=True)
    sw.add_argument("--shares", nargs="+", default=SHARES)
    sw.add_argument("--limits", nargs="+", default=LIMITS)
    sw.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="pick the least recall whose training evidence is within this of the best (default 0)",
    )
    sw.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    sys.exit(asyncio.run(capture(args)) if args.command == "capture" else sweep(args))
