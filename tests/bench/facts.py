"""Facts on LoCoMo: fact recall beside turn recall, what derivation costs,
and whether the fact worker moves an append's latency.

Usage::

    .venv/bin/python tests/run_bench.py facts --data ../shared/data/locomo/locomo-dev4.json \
        [--conversations N] [--sessions N] [--json PATH]

One run, one stack in this process: a nats-server, SQLite, the persistence,
indexing (MiniLM, embedded index), query and fact workers. The fact worker
asks the endpoint ``MEMQ_FACTS__LLM__*`` configures, or else Gemma 3 270M on
llama-cpp-python's server (started here: the local LLM of the tests).

1. **Appends without the fact worker**: p50/p90 of single appends to a
   scratch session, before any fact worker runs.
2. The conversations are appended (``--conversations``, each its own user,
   ``--sessions`` of each) and the fact worker derives them; the same
   appends are timed **while it works** (its LLM calls take the cores too:
   the figure says what a co-located fact worker costs an agent).
3. Once every session is derived: LLM calls, tokens in and out, and seconds
   per event (wall time of the derivation over the events derived).
4. For each question (categories 1-4, as the retrieval benchmark scores
   them): **fact recall@10**, the share of its evidence turns among the
   sources of the 10 best facts (the facts read's ranking); **turn
   recall@10**, the share among the 10 best turns of a hybrid search; and
   the **union** of both. By category, as a table and (``--json``) as JSON.

LoCoMo's two speakers are both people; memq plays speaker A as the user and
extracts facts about the user, so questions about speaker B find fewer facts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

import helpers
from helpers import make_settings, running, running_query, running_worker
from rich.table import Table
from services import LlamaServer, NatsServer

from bench import locomo
from bench.benchlib import console, machine_info, percentile, status, warn_if_busy, write_json
from memq.contracts.client import MemoryClient
from memq.workers.facts.worker import FactWorker
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.settings import Settings
from memq.workers.sql import facts as store
from memq.workers.sql.engine import create_engine

APP = "bench-facts"
K = 10
PROBES = 60  # single appends timed per phase
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def endpoint_settings(llama: LlamaServer | None) -> dict:
    """The facts group: from MEMQ_FACTS__* when an endpoint is configured, else the local LLM."""
    configured = Settings().facts
    if configured.llm is not None:
        return configured.model_dump(mode="json") | {
            "llm": configured.llm.model_dump(mode="json")
            | {"api_key": configured.llm.api_key.get_secret_value() if configured.llm.api_key else None}
        }
    assert llama is not None
    # Greedy decoding; a 270M model on a few cores takes minutes for a long reply: a generous timeout.
    llm = {
        "base_url": llama.url,
        "model": LlamaServer.model,
        "temperature": 0.0,
        "api_key": "sk-local",
        "max_tokens": 384,
        "timeout_s": 600,
    }
    return {"llm": llm, "response_format": "json_object", "batch_turns": 10}


async def probe_appends(client: MemoryClient, label: str) -> list[float]:
    times = []
    for i in range(PROBES):
        t0 = time.perf_counter()
        await client.append_text(f"probe-{label}", "s", "user", f"probe turn {i}")
        times.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.02)
    return times


async def behind(settings: Settings, users: list[str]) -> int:
    engine = create_engine(settings.database_url())
    try:
        async with engine.connect() as conn:
            gen = await store.live_generation(conn)
            if gen is None:
                return -1
            return sum([await store.behind(conn, gen.name, APP, u) for u in users])
    finally:
        await engine.dispose()


def recall(wanted: set[str], found: list[str]) -> float:
    return len(wanted & set(found)) / len(wanted)


async def score(client: MemoryClient, conversations) -> dict:
    sums: dict[str, dict[str, list[float]]] = {}
    for c in conversations:
        for q in c.questions:
            if q.category not in locomo.SCORED or not q.evidence:
                continue
            wanted = {c.event_id(d) for d in q.evidence}
            facts = await client.facts(c.sample_id, q.question, limit=K)
            fact_turns = [s.event_id for f in facts.facts for s in f.sources]
            turns = [h.event_id for h in (await client.search(c.sample_id, q.question, mode="hybrid", k=K)).results]
            row = {"facts": recall(wanted, fact_turns), "turns": recall(wanted, turns)}
            row["union"] = recall(wanted, fact_turns + turns)
            for key in (CATEGORIES[q.category], "overall"):
                for what, value in row.items():
                    sums.setdefault(key, {}).setdefault(what, []).append(value)
    return {cat: {w: statistics.fmean(v) for w, v in by.items()} | {"n": len(by["facts"])} for cat, by in sums.items()}


async def measure(work: Path, conversations, llama: LlamaServer | None) -> dict:
    with NatsServer() as nats:
        settings = make_settings(nats.url, f"sqlite+aiosqlite:///{work}/memq.db", work)
        settings.indexing = type(settings.indexing).model_validate(
            {**settings.indexing.model_dump(), "backend": "embedded", "batch_wait_s": 0.05}
        )
        settings.facts = type(settings.facts).model_validate(
            {**endpoint_settings(llama), "sweep_interval_s": 1.0, "max_concurrent": 2}
        )
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(running_worker(settings))
            indexing = await stack.enter_async_context(running(IndexingWorker(settings)))
            await asyncio.wait_for(indexing.ready.wait(), 300)
            await stack.enter_async_context(running_query(settings))
            client = await stack.enter_async_context(await MemoryClient.connect(nats.url, app=APP))
            status("appends without the fact worker")
            without = await probe_appends(client, "without")
            events = last = 0
            for c in conversations:
                for session, turns in c.sessions.items():
                    seqs = await client.append_many(c.sample_id, session, [c.event(t) for t in turns])
                    events, last = events + len(seqs), max(last, *seqs)
            await helpers.wait_committed(nats.url, last, timeout=600)
            users = [c.sample_id for c in conversations]
            status(f"deriving facts from {events} events with {settings.facts.llm.model}")
            started = time.perf_counter()
            worker = await stack.enter_async_context(running(FactWorker(settings)))
            await asyncio.sleep(2)  # let it start asking
            during = await probe_appends(client, "during")
            while (left := await behind(settings, users)) != 0:
                st = worker.stats
                status(
                    f"  {left} sessions left: {st.llm_calls} LLM calls, {st.facts_changed} revisions, "
                    f"{st.dead_lettered} dead letters, {st.failures} failed asks (retried)"
                )
                await asyncio.sleep(5)
            seconds = time.perf_counter() - started
            status("scoring")
            recalls = await score(client, conversations)
            engine = create_engine(settings.database_url())
            try:
                async with engine.connect() as conn:
                    gen = await store.live_generation(conn)
                    assert gen is not None
                    facts = [f for u in users for f in (await store.user_facts(conn, gen.name, APP, u)).values()]
            finally:
                await engine.dispose()
            st = worker.stats
            return {
                "model": settings.facts.llm.model,
                "events": events,
                "facts": len(facts),
                "current": sum(f.current for f in facts),
                "llm_calls": st.llm_calls,
                "tokens_in": st.tokens_in,
                "tokens_out": st.tokens_out,
                "dead_lettered": st.dead_lettered,
                "seconds": seconds,
                "calls_per_event": st.llm_calls / events,
                "tokens_per_event": (st.tokens_in + st.tokens_out) / events,
                "seconds_per_event": seconds / events,
                "append_ms": {
                    "without": {"p50": percentile(without, 50), "p90": percentile(without, 90)},
                    "during": {"p50": percentile(during, 50), "p90": percentile(during, 90)},
                },
                "recall": recalls,
            }


def print_result(r: dict) -> None:
    cost = Table(title=f"deriving facts with {r['model']}: {r['events']} events")
    for column in (
        "facts",
        "current",
        "LLM calls",
        "tokens in",
        "tokens out",
        "dead letters",
        "s/event",
        "calls/event",
    ):
        cost.add_column(column, justify="right")
    cost.add_row(
        str(r["facts"]),
        str(r["current"]),
        str(r["llm_calls"]),
        str(r["tokens_in"]),
        str(r["tokens_out"]),
        str(r["dead_lettered"]),
        f"{r['seconds_per_event']:.2f}",
        f"{r['calls_per_event']:.2f}",
    )
    console.print(cost)
    appends = Table(title=f"single appends, ms ({PROBES} each)")
    for column in ("", "p50", "p90"):
        appends.add_column(column, justify="right")
    for phase, label in (("without", "no fact worker"), ("during", "fact worker deriving")):
        appends.add_row(label, f"{r['append_ms'][phase]['p50']:.2f}", f"{r['append_ms'][phase]['p90']:.2f}")
    console.print(appends)
    table = Table(title=f"evidence recall@{K}: the sources of the top facts, the top turns, and both")
    for column in ("category", "questions", "facts", "turns", "union"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for cat in (*CATEGORIES.values(), "overall"):
        if cat in r["recall"]:
            row = r["recall"][cat]
            table.add_row(cat, str(row["n"]), f"{row['facts']:.3f}", f"{row['turns']:.3f}", f"{row['union']:.3f}")
    console.print(table)


async def main(args) -> None:
    machine = machine_info()
    warn_if_busy(machine)
    conversations = locomo.load(args.data, args.conversations)
    for c in conversations:
        c.sessions = dict(list(c.sessions.items())[: args.sessions])
        kept = {t.dia_id for t in c.turns}
        c.questions = [q for q in c.questions if q.evidence and set(q.evidence) <= kept]
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="memq-bench-facts-") as tmp:
        llama = None if Settings().facts.llm is not None else stack.enter_context(LlamaServer())
        result = await measure(Path(tmp), conversations, llama)
    print_result(result)
    config = {"conversations": args.conversations, "sessions": args.sessions, "endpoint": "MEMQ_FACTS__LLM__*"}
    if llama is not None:
        config["endpoint"] = "local: Gemma 3 270M (q4_k_m) on llama-cpp-python"
    write_json(args.json, "facts", machine, config=config, result=result)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="LoCoMo JSON (e.g. ../shared/data/locomo/locomo-dev4.json)"
    )
    parser.add_argument("--conversations", type=int, default=1, help="LoCoMo conversations (each its own user)")
    parser.add_argument("--sessions", type=int, default=3, help="sessions of each conversation")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
