"""What is specific to the embedded index (the shared behaviour is in
tests/integration/test_index_contract.py): FTS query building, the vector
cache across instances on one file, promote racing writes, reopening, and
the errors a bad file gives."""

from __future__ import annotations

import asyncio
import math
import random
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from memq.workers.index.backends.base import IndexUnavailable, UnknownGeneration
from memq.workers.index.backends.embedded import EmbeddedIndex, match_expression
from memq.workers.memory.recall import Doc, SearchQuery, Turn, relative_score_fusion, search_text

DIM = 8
INJECTIONS = [
    '"foo" AND bar* NEAR(x) -y :z \' "',
    '"',
    '""',
    "AND",
    "OR NOT",
    "NEAR(a b, 2)",
    "puppy*",
    "^puppy",
    "col:puppy",
    "search_text:puppy",
    "-puppy",
    "(puppy",
    "puppy)",
    "{search_text}: puppy",
    "p'u\"p;p--y",
    "   ",
    "",
    "😀 🐶",
    "_",
    "\x00puppy",
]


def unit(*xs: float) -> list[float]:
    v = list(xs) + [0.0] * (DIM - len(xs))
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v]


def doc(text: str, vector, *, seq: int, session: str = "s1", user: str = "alice", id: str | None = None) -> Doc:
    return Doc(
        id=id or f"ev-{seq}",
        app="app",
        user=user,
        session=session,
        seq=seq,
        author="user",
        role="user",
        timestamp=1_700_000_000.0 + seq,
        text=text,
        search_text=search_text("user", text, None),
        vector=vector,
    )


def q(text: str = "", *, mode: str = "keyword", **kw) -> SearchQuery:
    return SearchQuery(app="app", user=kw.pop("user", "alice"), text=text, mode=mode, **kw)


async def opened(path: Path, *, promote: bool = False) -> EmbeddedIndex:
    index = EmbeddedIndex(path)
    await index.open()
    if promote:
        await index.promote((await index.create_generation("test", DIM)).generation)
    return index


@pytest.fixture
async def index(tmp_path):
    index = await opened(tmp_path / "index.db", promote=True)
    yield index
    await index.close()


def test_match_expression_quotes_every_word():
    assert match_expression("Hello, wörld! hello") == '"hello" OR "wörld"'
    assert (
        match_expression('"foo" AND bar* NEAR(x) -y :z \' "')
        == '"foo" OR "bar" OR "near" OR "x" OR "y" OR "z"'  # "and": a stopword, as in Weaviate
    )
    assert match_expression("snake_case") == '"snake" OR "case"'  # split as unicode61 splits
    for text in ("", "   ", "*:-()\"'", "_", "😀", "The AND of it"):
        assert match_expression(text) is None


@pytest.mark.parametrize("text", INJECTIONS)
async def test_fts_syntax_in_user_text_never_raises(index, text):
    await index.upsert([doc("AND near puppy col x y z foo bar", unit(1), seq=1)])
    for mode in ("keyword", "hybrid"):
        await index.search(q(text, mode=mode, vector=unit(1)))  # no exception is the test
    # Words are still found however they are wrapped; nothing else matches.
    assert [h.doc.id for h in await index.search(q('"puppy" AND NOT(zzz*)'))] == ["ev-1"]
    assert await index.search(q("-zzz* :qqq")) == []


async def test_a_hybrid_search_without_words_or_vector_runs_one_side(index):
    await index.upsert([doc("anything at all", unit(1), seq=1)])
    assert await index.search(q("?! ...")) == []
    [hit] = await index.search(q("?! the", mode="hybrid", vector=unit(1)))  # no words: by vector
    assert hit.doc.id == "ev-1" and hit.scores == {"vector": pytest.approx(1.0)}
    [hit] = await index.search(q("anything", mode="hybrid"))  # no vector: by keyword
    assert hit.doc.id == "ev-1" and set(hit.scores) == {"keyword"}
    with pytest.raises(ValueError, match="needs query.vector"):
        await index.search(q("anything", mode="vector"))


async def test_keyword_ranking_is_the_same_with_or_without_filters(index):
    """Two SQL paths (FTS5 alone; joined with the docs for filters) rank alike."""
    rng = random.Random(3)
    words = ["puppy", "trip", "lisbon", "paint", "taxes", "guitar", "the", "a"]
    await index.upsert([doc(" ".join(rng.choices(words, k=rng.randint(2, 9))), unit(1), seq=i) for i in range(1, 60)])
    await index.upsert([doc("puppy puppy lisbon", unit(1), seq=99, user="bob")])  # another user's doc
    for text in ("puppy", "lisbon guitar", "the puppy trip"):
        plain = [(h.doc.id, h.score) for h in await index.search(q(text, k=100))]
        filtered = [(h.doc.id, h.score) for h in await index.search(q(text, k=100, since=0.0, roles=("user",)))]
        assert plain and plain == filtered


async def test_hybrid_is_relative_score_fusion_of_both_sides(index):
    rng = random.Random(1)
    words = ["puppy", "trip", "lisbon", "paint", "taxes", "guitar"]
    await index.upsert(
        [doc(" ".join(rng.choices(words, k=4)), unit(*(rng.random() for _ in range(DIM))), seq=i) for i in range(1, 40)]
    )
    vector = unit(*(rng.random() for _ in range(DIM)))
    kw = await index.search(q("puppy lisbon", k=100))
    vec = await index.search(q(mode="vector", vector=vector, k=100))
    for alpha in (0.0, 0.3, 0.5, 1.0):
        hybrid = await index.search(q("puppy lisbon", mode="hybrid", vector=vector, alpha=alpha, k=10))
        expected = relative_score_fusion(
            [(h.doc.uuid, h.score) for h in kw], [(h.doc.uuid, h.score) for h in vec], alpha
        )[:10]
        assert [(h.doc.uuid, pytest.approx(h.score)) for h in hybrid] == [(u, pytest.approx(s)) for u, s in expected]


async def test_a_second_instance_sees_every_kind_of_write(tmp_path):
    """The vector cache of one instance against a cold instance after each of
    many random writes by another: new docs, overwritten vectors, deletes
    (each path of the cache's refresh)."""
    path = tmp_path / "index.db"
    writer, reader = await opened(path, promote=True), await opened(path)
    rng = random.Random(5)
    seq = 0
    known: list[Doc] = []
    try:
        for step in range(60):
            op = rng.choice(["new", "new", "overwrite", "delete-session", "delete-user", "other-user"])
            if op in ("new", "other-user") or not known:
                seq += 1
                d = doc(
                    f"note {seq}",
                    unit(*(rng.random() for _ in range(DIM))),
                    seq=seq,
                    session=rng.choice("abc"),
                    user="bob" if op == "other-user" else "alice",
                )
                known.append(d)
                await writer.upsert([d])
            elif op == "overwrite":
                await writer.upsert([rng.choice(known).with_vector(unit(*(rng.random() for _ in range(DIM))))])
            elif op == "delete-session":
                await writer.delete_session("app", "alice", rng.choice("abc"), before_seq=rng.randint(1, seq + 1))
            else:
                await writer.delete_user("app", "alice", before_seq=rng.randint(1, seq + 1))
            query = q(
                mode="vector",
                vector=unit(*(rng.random() for _ in range(DIM))),
                k=100,
                session=rng.choice([None, "a", "b"]),
            )
            cold = await opened(path)
            try:
                expected = [(h.doc.id, round(h.score, 5)) for h in await cold.search(query)]
            finally:
                await cold.close()
            got = [(h.doc.id, round(h.score, 5)) for h in await reader.search(query)]
            assert got == expected, (step, op)
    finally:
        await writer.close()
        await reader.close()


async def test_promote_in_one_instance_while_another_writes(tmp_path):
    """Writes with generation=None resolve the live generation inside their
    own transaction: none fails or lands in the generation being dropped, so
    the new live generation holds exactly the writes after the switch."""
    path = tmp_path / "index.db"
    promoter, writer = await opened(path, promote=True), await opened(path)
    old = await promoter.live()
    fresh = await promoter.create_generation("test", DIM)
    promoted = asyncio.Event()
    written = 0

    async def write():  # one doc per transaction, until 50 after the switch
        nonlocal written
        after = 0
        while after < 50:
            written += 1
            # Counted if *issued* after promote() returned. One that merely
            # returns after it may have committed to the old generation first
            # (its thread was slower to report back than the promoter's, on a
            # busy machine).
            issued_after = promoted.is_set()
            await writer.upsert([doc(f"note {written}", unit(1, written), seq=written)])
            after += issued_after

    async def promote():
        while written < 100:  # switch in the middle of the stream of writes
            await asyncio.sleep(0.001)
        await promoter.promote(fresh.generation)
        promoted.set()

    try:
        await asyncio.gather(write(), promote())
        assert (await writer.live()).generation == fresh.generation
        seqs = sorted([d.seq async for d in writer.export()])
        assert seqs == list(range(seqs[0], written + 1))  # every write after the switch, none before
        assert seqs[0] >= 100 and len(seqs) >= 50  # (the 100th write may still be in flight at the switch)
        tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
        number = old.generation.removeprefix("g")
        assert not {f"docs_{number}", f"fts_{number}"} & tables  # the old generation is gone
    finally:
        await promoter.close()
        await writer.close()


async def test_reopening_the_file_keeps_everything(tmp_path):
    path = tmp_path / "data" / "index.db"  # the directory is created too
    index = await opened(path, promote=True)
    docs = [doc(f"puppy story {i}", unit(1, i / 10), seq=i, session=f"s{i % 3}") for i in range(1, 30)]
    await index.upsert(docs)
    building = await index.create_generation("other", 4)
    before = (await index.live(), await index.search(q("puppy", mode="hybrid", vector=unit(1), k=50)))
    await index.close()

    index = await opened(path)
    try:
        assert await index.live() == before[0]
        assert building.generation in {g.generation for g in await index.generations()}
        assert await index.count() == len(docs)
        assert await index.search(q("puppy", mode="hybrid", vector=unit(1), k=50)) == before[1]
        exported = {d.id: d for d in [d async for d in index.export()]}
        assert np.allclose(exported["ev-7"].vector, docs[6].vector, atol=1e-6)
    finally:
        await index.close()


async def test_missing_or_wrong_vectors_are_refused(index):
    with pytest.raises(ValueError, match="3-dimensional"):
        await index.upsert([doc("x", [1.0, 0.0, 0.0], seq=1)])
    with pytest.raises(ValueError, match="no vector"):
        await index.upsert([doc("x", None, seq=1)])
    with pytest.raises(ValueError, match="dimensions"):
        await index.search(q(mode="vector", vector=[1.0, 0.0]))
    assert await index.count() == 0


async def test_without_a_live_generation_reads_are_empty_and_writes_fail(tmp_path):
    index = await opened(tmp_path / "index.db")
    try:
        assert await index.live() is None
        assert await index.search(q("x")) == [] and await index.count() == 0
        assert [d async for d in index.export()] == []
        with pytest.raises(IndexUnavailable, match="no live generation"):
            await index.upsert([doc("x", unit(1), seq=1)])
        with pytest.raises(UnknownGeneration, match="no index generation"):
            await index.count(generation="g99")
    finally:
        await index.close()


async def test_the_live_generation_cannot_be_dropped(index):
    live = await index.live()
    with pytest.raises(ValueError, match="live"):
        await index.drop_generation(live.generation)
    await index.drop_generation("g12345")  # unknown: nothing to do


@pytest.mark.parametrize(
    "content",
    [b"this is not a database" * 100, b"SQLite format 3\x00" + b"\xff" * 4000],
    ids=["garbage", "broken-header"],
)
async def test_an_unreadable_file_is_unavailable_with_its_path(tmp_path, content):
    path = tmp_path / "index.db"
    path.write_bytes(content)
    index = EmbeddedIndex(path)
    with pytest.raises(IndexUnavailable, match=str(path)):
        await index.open()
    await index.close()


async def test_another_sqlite_file_is_not_taken_for_an_index(tmp_path):
    path = tmp_path / "memq.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA application_id = 42")
    with pytest.raises(IndexUnavailable, match="not a memq index"):
        await EmbeddedIndex(path).open()
    with pytest.raises(IndexUnavailable, match=str(tmp_path)):
        await EmbeddedIndex(tmp_path).open()  # a directory


def test_match_expression_with_grams_quotes_bigrams_too():
    assert match_expression('"机器学习" AND python*', grams=True) == '"机器" OR "器学" OR "学习" OR "python"'
    assert match_expression("私はPythonで", grams=True) == '"私は" OR "python" OR "で"'


async def test_a_generation_from_before_grams_keeps_working_until_a_rebuild_adds_them(tmp_path, monkeypatch):
    from memq.workers.index.backends import embedded

    docs = [doc("私の名前は太郎です", unit(1), seq=1), doc("Researching adoption agencies", unit(0, 1), seq=2)]
    index = await opened(tmp_path / "index.db")
    try:
        schema = embedded.generation_schema
        with monkeypatch.context() as m:  # a generation as memq made them before issue 29
            m.setattr(embedded, "generation_schema", lambda n, grams: schema(n, False))
            old = await index.create_generation("test", DIM)
        await index.promote(old.generation)
        await index.upsert(docs)
        assert [h.doc.id for h in await index.search(q("research"))] == ["ev-2"]  # English: as before
        assert await index.search(q("太郎")) == []  # one token per clause: the word inside is not found
        new = await index.create_generation("test", DIM)  # what `memq index rebuild` does
        await index.upsert(docs, generation=new.generation)
        await index.promote(new.generation)
        assert [h.doc.id for h in await index.search(q("太郎"))] == ["ev-1"]
        assert [h.doc.id for h in await index.search(q("research"))] == ["ev-2"]
    finally:
        await index.close()


async def test_a_generation_from_before_the_context_columns_keeps_working_until_a_rebuild(tmp_path, monkeypatch):
    from memq.workers.index.backends import embedded

    said = doc("I write Python every day", unit(1), seq=1)
    reply = doc("Nice.", unit(0, 1), seq=2)
    reply = replace(reply, search_text=search_text("user", "Nice.", None, Turn("user", said.text)))
    index = await opened(tmp_path / "index.db")
    try:
        schema = embedded.generation_schema
        with monkeypatch.context() as m:  # a generation as memq made them between issues 29 and 40
            m.setattr(embedded, "generation_schema", lambda n, grams: schema(n, True, context=False))
            old = await index.create_generation("test", DIM)
        await index.promote(old.generation)
        await index.upsert([said, reply])
        hits = await index.search(q("python"))
        assert {h.doc.id for h in hits} == {"ev-1", "ev-2"}
        assert {h.doc.id: h.doc.search_text for h in hits}["ev-2"] == reply.search_text
        new = await index.create_generation("test", DIM)  # what `memq index rebuild` does
        await index.upsert([said, reply], generation=new.generation)
        await index.promote(new.generation)
        hits = await index.search(q("python"))
        assert [h.doc.id for h in hits] == ["ev-1", "ev-2"]
        assert hits[0].score > hits[1].score
        assert hits[1].doc.search_text == reply.search_text  # given back whole: search_text || context
        exported = {d.id: d.search_text async for d in index.export()}
        assert exported == {"ev-1": said.search_text, "ev-2": reply.search_text}
    finally:
        await index.close()


async def test_a_file_from_before_recorded_floors_opens_and_records_them_from_then_on(tmp_path):
    index = await opened(tmp_path / "index.db")
    try:
        old = await index.create_generation("test", DIM)
        await index.promote(old.generation)
    finally:
        await index.close()
    with sqlite3.connect(tmp_path / "index.db") as db:  # the generations table as memq made it before issue 41
        db.execute("ALTER TABLE generations DROP COLUMN min_similarity")
    index = await opened(tmp_path / "index.db")
    try:
        assert (await index.live()).min_similarity is None  # none recorded: a search takes its model's
        new = await index.create_generation("test", DIM, min_similarity=0.8)
        assert [g.min_similarity for g in await index.generations()] == [None, 0.8]
        await index.promote(new.generation)
        assert (await index.live()).min_similarity == 0.8
    finally:
        await index.close()
