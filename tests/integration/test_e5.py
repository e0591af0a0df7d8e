"""The e5 embedder (multilingual-e5-small) in the index, on both backends
(issue 41): an e5 generation is found by keyword and by vector; a question
in Chinese, Spanish or German finds an English memory and an English
question one in those languages (tests/data/crosslingual.json); each
embedder's relevance floor drops unrelated queries; and a rebuild migrates
a MiniLM index to e5 while a client searches, with no failed search."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from helpers import (
    SharedEmbedder,
    make_settings,
    running,
    running_query,
    running_worker,
    wait_for,
    wait_indexed,
    weaviate_collection,
)
from search_stack import open_index, searcher

from memq.contracts import queries as q
from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.index.backends import open_backend
from memq.workers.index.embedders.e5 import E5Embedder
from memq.workers.index.embedders.floors import floor_for
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.indexer import make_indexer
from memq.workers.indexing.rebuild import rebuild
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.memory.recall import Doc, search_text
from memq.workers.query.search import Searcher
from memq.workers.sql.engine import create_engine

pytestmark = pytest.mark.timeout(300)

APP, USER = "e5-app", "caroline"
TS = 1_683_504_000.0
CASES = json.loads((Path(__file__).resolve().parents[1] / "data" / "crosslingual.json").read_text())
WEAVIATE = pytest.mark.services  # its server comes through getfixturevalue, unseen by conftest's marking


@pytest.fixture(scope="module")
def embedders() -> dict:
    return {"local": LocalEmbedder(), "e5": E5Embedder()}


async def _indexed(request, tmp_path, embedder, kind: str):
    """An index of ``kind`` whose live generation holds the cases' memories, embedded by ``embedder``."""
    index = await open_index(request, kind, tmp_path, embedder)
    docs = [
        Doc(
            m["id"],
            APP,
            USER,
            "s1",
            i + 1,
            m["speaker"],
            "user",
            TS + 60 * i,
            m["text"],
            search_text(m["speaker"], m["text"], TS + 60 * i),
        )
        for i, m in enumerate(CASES["memories"])
    ]
    vectors = await embedder.embed([d.search_text for d in docs])
    await index.upsert([d.with_vector(v) for d, v in zip(docs, vectors)])
    return index


@pytest.fixture(params=["embedded", pytest.param("weaviate", marks=WEAVIATE)])
def kind(request) -> str:
    return request.param


async def _ids(s: Searcher, text: str, mode: str, k: int = 3) -> list[str]:
    found = await s.search(q.Search(app=APP, user=USER, query=text, mode=mode, k=k))
    return [r.event_id for r in found.results]


async def test_an_e5_generation_is_found_by_keyword_and_by_vector(request, tmp_path, embedders, kind):
    e5 = embedders["e5"]
    index = await _indexed(request, tmp_path, e5, kind)
    try:
        live = await index.live()
        assert (live.model, live.dim, live.min_similarity) == (e5.model, 384, floor_for(e5.model))
        s = searcher(index, e5)
        assert (await _ids(s, "pottery", "keyword"))[0] == "en-pottery"
        assert (await _ids(s, "paella", "keyword"))[0] == "es-cooking"
        # no word in common: the vector side alone
        assert (await _ids(s, "What did Melanie make with clay?", "vector"))[0] == "en-pottery"
        assert (await _ids(s, "Who has a new pet dog?", "hybrid"))[0] == "en-dog"
        reply = await s.search(q.Search(app=APP, user=USER, query="a new pet dog", mode="vector", k=1))
        assert (reply.mode, reply.model, reply.note) == ("vector", e5.model, None)
    finally:
        await index.close()


# Hybrid may miss this many (of 30) in its top 3: a question shares only its
# speaker's name with a memory in another language, so the keyword side ranks
# that speaker's memories in the question's language first, and e5 has
# "Which city is Caroline moving to?" nearer her Lisbon trip (0.832) than the
# Chinese memory of her move to Shanghai (0.803).
HYBRID_MISSES = 2


async def test_questions_in_another_language_find_their_memories_with_e5(request, tmp_path, embedders, kind):
    found: dict[str, dict[str, list[str]]] = {}
    for name, embedder in embedders.items():
        index = await _indexed(request, tmp_path / name, embedder, kind)
        try:
            s = searcher(index, embedder)
            found[name] = {
                mode: [c["question"] for c in CASES["questions"] if c["memory"] in await _ids(s, c["question"], mode)]
                for mode in ("vector", "hybrid")
            }
        finally:
            await index.close()
    total = len(CASES["questions"])
    for name, by_mode in found.items():
        print(f"{kind} {name}: " + ", ".join(f"{m} {len(h)}/{total} in the top 3" for m, h in by_mode.items()))
    missed = {
        m: [c["question"] for c in CASES["questions"] if c["question"] not in found["e5"][m]] for m in found["e5"]
    }
    assert not missed["vector"], missed
    assert len(missed["hybrid"]) <= HYBRID_MISSES, missed
    # what the multilingual model is for: MiniLM finds under half of them
    for mode, hits in found["local"].items():
        assert len(hits) < total / 2, (mode, hits)


@pytest.mark.parametrize("name", ["local", "e5"])
async def test_the_floor_drops_an_unrelated_query_with_each_embedder(request, tmp_path, embedders, kind, name):
    embedder = embedders[name]
    index = await _indexed(request, tmp_path, embedder, kind)
    try:
        s = searcher(index, embedder)  # recall.min_similarity unset: the generation's floor
        assert s.relevance_floor(await index.live()) == floor_for(embedder.model)
        for text in CASES["unrelated"]:
            for mode in ("vector", "hybrid"):
                assert await _ids(s, text, mode, k=5) == [], (text, mode)
            assert await s.recall(APP, USER, text, k=5) == []
        # ... and keeps what relates (in the memory's language)
        assert (await _ids(s, "When is the sister's wedding in Lisbon?", "vector"))[0] == "en-lisbon"
        unfloored = searcher(index, embedder, min_similarity=-1.0)
        assert len(await _ids(unfloored, CASES["unrelated"][0], "vector", k=5)) == 5
    finally:
        await index.close()


# --- a whole migration through the workers ---------------------------------------------


def _say(text: str) -> Event:
    return Event(author="Caroline", message=Message(role="user", parts=[TextPart(text=text)]))


@pytest.mark.parametrize("backend", ["embedded", pytest.param("weaviate", marks=WEAVIATE)])
async def test_a_rebuild_migrates_a_minilm_index_to_e5_with_no_failed_search(
    nats_url, sqlite_url, tmp_path, backend, request, embedders
):
    """The workers run with MiniLM; ``rebuild`` (as ``memq index rebuild``
    with ``indexing.embedder = "e5"``, on a backend of its own) replays the
    stream into an e5 generation and switches, while a client searches every
    few ms by keyword, vector and hybrid. The query worker, configured for
    MiniLM, opens e5 for the new generation itself: its searches stay vector
    searches, and none fails or comes back empty."""
    s = make_settings(nats_url, sqlite_url, tmp_path)
    extra = {}
    if backend == "weaviate":
        server = request.getfixturevalue("weaviate_server")
        extra = {"weaviate": weaviate_collection(server, "M")}
    s.indexing = type(s.indexing).model_validate(
        {**s.indexing.model_dump(), "backend": backend, "batch_wait_s": 0.05, **extra}
    )
    minilm, e5 = embedders["local"], embedders["e5"]
    async with (
        running_worker(s),
        running(IndexingWorker(s), embedder=SharedEmbedder(minilm)) as indexing,
        running_query(s) as query,
        await MemoryClient.connect(nats_url, app=APP) as client,
    ):
        await asyncio.wait_for(indexing.ready.wait(), 60)
        query.searcher.embedder = SharedEmbedder(minilm)
        seq = 0
        for i, m in enumerate(CASES["memories"]):
            seq = await client.append(USER, f"s{i % 3}", _say(m["text"]))
        await wait_indexed(client, seq)
        before = await indexing.live.backend.live()
        assert before.model == minilm.model

        questions = {"keyword": "golden retriever puppy", "vector": "Who adopted a puppy?", "hybrid": "my puppy Max"}
        answers: list[tuple[float, str, int, str | None, str]] = []  # (when, mode asked, hits, model, mode used)
        errors: list[str] = []
        done = asyncio.Event()

        async def search_all_along() -> None:
            modes = list(questions)
            while not done.is_set():
                mode = modes[len(answers) % 3]
                try:
                    found = await client.search(USER, questions[mode], mode=mode, k=3)
                    answers.append((time.monotonic(), mode, len(found.results), found.model, found.mode))
                except Exception as exc:  # noqa: BLE001 - any error is what this test looks for
                    errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.005)

        searching = asyncio.create_task(search_all_along())
        e5_settings = s.model_copy(update={"indexing": s.indexing.model_copy(update={"embedder": "e5"})})
        own = open_backend(e5_settings)  # the rebuild's own backend, as in its own process
        await own.open()
        engine = create_engine(s.database_url())
        try:
            await wait_for(lambda: _some(answers), what="the first answers")
            result = await rebuild(
                e5_settings, indexing.nc, make_indexer(e5_settings, own, e5, indexing.live.js, engine=engine)
            )
            switched = time.monotonic()
            await asyncio.sleep(3)  # past the query worker's LIVE_REFRESH_S: it has seen the switch
        finally:
            done.set()
            await searching
            await own.close()
            await engine.dispose()
        live = await indexing.live.backend.live()
        assert result.generation == live.generation != before.generation
        assert (live.model, live.min_similarity) == (e5.model, floor_for(e5.model))
        assert not errors, errors[:5]
        assert all(n > 0 for _, _, n, _, _ in answers), "an empty answer"
        after = [(asked, model, used) for t, asked, _, model, used in answers if t > switched + LIVE_GRACE_S]
        assert after, "no search after the switch"
        # answered from the e5 generation, by the mode asked for: never by keyword for want of a model
        assert {(model, asked == used) for asked, model, used in after} == {(e5.model, True)}


LIVE_GRACE_S = 2.5  # the query worker re-reads the live generation at least this often (LIVE_REFRESH_S 2.0)


async def _some(answers: list) -> bool:
    return bool(answers)
