"""One behavioural contract for every index backend (embedded and Weaviate).

Vectors here are small hand-made unit vectors, so what "nearest" means is
known without an embedder. Each test gets a fresh index (a new file, or new
collection names on the shared Weaviate server).
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import replace

import pytest

from memq.workers.index.backends.base import IndexBackend
from memq.workers.memory.recall import Doc, SearchQuery, Turn, search_text

DIM = 8
MODEL = "test:unit-vectors"


def unit(*xs: float) -> list[float]:
    v = list(xs) + [0.0] * (DIM - len(xs))
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v]


def doc(
    text: str,
    vector: list[float],
    *,
    seq: int,
    app: str = "app-a",
    user: str = "alice",
    session: str = "s1",
    author: str = "user",
    role: str = "user",
    ts: float = 1_700_000_000.0,
    id: str | None = None,
) -> Doc:
    return Doc(
        id=id or f"ev-{app}-{user}-{session}-{seq}",
        app=app,
        user=user,
        session=session,
        seq=seq,
        author=author,
        role=role,
        timestamp=ts,
        text=text,
        search_text=search_text(author, text, ts),
        vector=vector,
    )


def q(
    text: str = "", *, mode: str = "keyword", vector=None, k: int = 10, app="app-a", user="alice", **kw
) -> SearchQuery:
    return SearchQuery(app=app, user=user, text=text, mode=mode, k=k, vector=vector, **kw)


WEAVIATE = pytest.mark.services  # its server comes through getfixturevalue, unseen by conftest's marking


@pytest.fixture(
    params=[
        "embedded",
        pytest.param("weaviate-filter", marks=WEAVIATE),
        pytest.param("weaviate-tenant", marks=WEAVIATE),
    ]
)
async def index(request, tmp_path):
    if request.param == "embedded":
        from memq.workers.index.backends.embedded import EmbeddedIndex

        backend = EmbeddedIndex(tmp_path / "index.db")
    else:
        from memq.workers.index.backends.weaviate import WeaviateIndex
        from memq.workers.settings import WeaviateSettings

        server = request.getfixturevalue("weaviate_server")
        backend = WeaviateIndex(
            WeaviateSettings(
                url=server.url,
                grpc_port=server.grpc_port,
                collection=f"T{uuid.uuid4().hex[:12]}",
                scoping=request.param.split("-", 1)[1],
            )
        )
    await backend.open()
    meta = await backend.create_generation(MODEL, DIM)
    await backend.promote(meta.generation)
    try:
        yield backend
    finally:
        for g in await backend.generations():
            live = await backend.live()
            if live is None or g.generation != live.generation:
                await backend.drop_generation(g.generation)
        await backend.close()


async def ids(backend: IndexBackend, query: SearchQuery, **kw) -> list[str]:
    return [h.doc.id for h in await backend.search(query, **kw)]


CORPUS = [
    doc("I adopted a golden retriever puppy named Max", unit(1, 0.1), seq=1),
    doc("We are planning a trip to Lisbon in June", unit(0, 1), seq=2, author="bot", role="assistant"),
    doc("My sister Melanie paints landscapes", unit(0, 0, 1), seq=3, session="s2"),
    doc("The puppy chewed my running shoes", unit(0.9, 0, 0, 0.3), seq=4, session="s2", ts=1_700_100_000.0),
    doc("Quarterly taxes are due next week", unit(0, 0, 0, 0, 1), seq=5, ts=1_700_200_000.0),
]


async def test_is_a_backend(index):
    assert isinstance(index, IndexBackend)
    live = await index.live()
    assert live is not None and live.model == MODEL and live.dim == DIM


async def test_keyword_search_finds_words_best_first(index):
    await index.upsert(CORPUS)
    hits = await index.search(q("puppy"))
    assert {h.doc.id for h in hits} == {CORPUS[0].id, CORPUS[3].id}
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
    assert await ids(index, q("lisbon")) == [CORPUS[1].id]
    assert await ids(index, q("zeppelin")) == []


async def test_hits_carry_the_whole_doc(index):
    await index.upsert(CORPUS)
    [hit] = await index.search(q("Melanie"))
    d = hit.doc
    assert (d.id, d.app, d.user, d.session, d.seq, d.author, d.role) == (
        "ev-app-a-alice-s2-3",
        "app-a",
        "alice",
        "s2",
        3,
        "user",
        "user",
    )
    assert d.text == CORPUS[2].text and d.timestamp == CORPUS[2].timestamp


async def test_vector_search_is_nearest_by_cosine(index):
    await index.upsert(CORPUS)
    order = await ids(index, q(mode="vector", vector=unit(1, 0, 0, 0.2), k=3))
    assert order[:2] == [CORPUS[3].id, CORPUS[0].id] or order[:2] == [CORPUS[0].id, CORPUS[3].id]
    assert len(order) == 3
    hits = await index.search(q(mode="vector", vector=unit(0, 0, 1), k=1))
    assert hits[0].doc.id == CORPUS[2].id and hits[0].score == pytest.approx(1.0, abs=1e-3)


async def test_hybrid_prefers_docs_found_both_ways(index):
    await index.upsert(CORPUS)
    # "puppy" matches 1 and 4 by keyword; the vector points at 4 only.
    order = await ids(index, q("puppy", mode="hybrid", vector=unit(0.9, 0, 0, 0.3), alpha=0.5, k=5))
    assert order[0] == CORPUS[3].id
    assert CORPUS[0].id in order[:3]
    # alpha=0 is keyword only, alpha=1 vector only (for the top hit).
    assert (await ids(index, q("lisbon", mode="hybrid", vector=unit(0, 0, 1), alpha=0.0, k=1))) == [CORPUS[1].id]
    assert (await ids(index, q("lisbon", mode="hybrid", vector=unit(0, 0, 1), alpha=1.0, k=1))) == [CORPUS[2].id]


async def test_k_limits_results(index):
    await index.upsert(CORPUS)
    assert len(await index.search(q(mode="vector", vector=unit(1), k=2))) == 2
    assert len(await index.search(q(mode="vector", vector=unit(1), k=50))) == len(CORPUS)


async def test_filters(index):
    await index.upsert(CORPUS)
    v = unit(1, 1, 1, 1, 1)
    for mode in ("vector", "hybrid"):
        text = "puppy trip Melanie taxes"
        got = set(await ids(index, q(text, mode=mode, vector=v, session="s2")))
        assert got == {CORPUS[2].id, CORPUS[3].id}, mode
        got = set(await ids(index, q(text, mode=mode, vector=v, authors=("bot",))))
        assert got == {CORPUS[1].id}, mode
        got = set(await ids(index, q(text, mode=mode, vector=v, roles=("user",))))
        assert got == {CORPUS[0].id, CORPUS[2].id, CORPUS[3].id, CORPUS[4].id}, mode
        got = set(await ids(index, q(text, mode=mode, vector=v, since=1_700_050_000.0, until=1_700_150_000.0)))
        assert got == {CORPUS[3].id}, mode
    got = set(await ids(index, q("puppy", session="s1")))
    assert got == {CORPUS[0].id}


async def test_no_search_crosses_users_or_apps(index):
    rng = random.Random(7)
    words = ["puppy", "lisbon", "paint", "taxes", "guitar", "marathon"]
    docs = []
    for i in range(120):
        app, user = rng.choice(["app-a", "app-b"]), rng.choice(["alice", "bob", "carol"])
        text = " ".join(rng.choices(words, k=3))
        docs.append(
            doc(
                text,
                unit(*[rng.random() for _ in range(DIM)]),
                seq=i + 1,
                app=app,
                user=user,
                session=rng.choice(["s1", "s2"]),
            )
        )
    await index.upsert(docs)
    for _ in range(30):
        query = q(
            rng.choice(words),
            mode=rng.choice(["keyword", "vector", "hybrid"]),
            vector=unit(*[rng.random() for _ in range(DIM)]),
            app=rng.choice(["app-a", "app-b"]),
            user=rng.choice(["alice", "bob", "carol"]),
            session=rng.choice([None, "s1"]),
            k=50,
        )
        hits = await index.search(query)
        assert hits, query
        assert all(query.matches(h.doc) for h in hits), query
        in_scope = [d for d in docs if query.matches(d)]
        if query.mode == "vector":
            assert len(hits) == min(50, len(in_scope))


async def test_upsert_is_idempotent_and_overwrites(index):
    await index.upsert(CORPUS)
    await index.upsert(CORPUS)  # redelivered batch
    assert await index.count() == len(CORPUS)
    changed = Doc(**{**CORPUS[4].__dict__, "text": "Taxes were filed", "search_text": "user: Taxes were filed"})
    await index.upsert([changed])
    assert await index.count() == len(CORPUS)
    assert await ids(index, q("filed")) == [CORPUS[4].id]
    assert await ids(index, q("quarterly")) == []


async def test_a_rewrite_writes_each_doc_from_scratch(index):
    """A redelivered batch is written with ``rewrite``: its docs may be half
    there (Weaviate killed mid-batch keeps objects whose keyword entries it
    lost, and an unchanged put re-indexes nothing; tests/bench/weaviate_halfwrite.py
    shows it), so each is deleted and put again: the index still holds each
    doc once, each findable by keyword and by vector."""
    await index.upsert(CORPUS)
    await index.upsert(CORPUS, rewrite=True)
    await index.upsert(CORPUS[:3], rewrite=True)
    assert await index.count() == len(CORPUS)
    for d in CORPUS:
        assert d.id in await ids(index, q(d.text.split()[-1], k=len(CORPUS)))
        assert d.id in await ids(index, q(mode="vector", vector=d.vector, k=len(CORPUS)))


async def test_same_event_id_in_two_sessions_are_two_docs(index):
    a = doc("alpha note", unit(1), seq=1, session="s1", id="same-id")
    b = doc("beta note", unit(0, 1), seq=2, session="s2", id="same-id")
    await index.upsert([a, b])
    assert await index.count() == 2


async def test_delete_session_and_user(index):
    other = doc("bob has a puppy too", unit(1), seq=10, user="bob")
    other_app = doc("puppy in another app", unit(1), seq=11, app="app-b")
    await index.upsert(CORPUS + [other, other_app])
    await index.delete_session("app-a", "alice", "s2")
    assert set(await ids(index, q("puppy"))) == {CORPUS[0].id}
    assert await index.count(app="app-a", user="alice") == 3
    await index.delete_user("app-a", "alice")
    assert await index.count(app="app-a", user="alice") == 0
    assert await ids(index, q("puppy", user="bob")) == [other.id]
    assert await ids(index, q("puppy", app="app-b")) == [other_app.id]
    await index.delete_session("app-a", "alice", "nope")  # nothing to delete: no error


async def test_delete_spares_docs_newer_than_the_delete(index):
    old = doc("old puppy story", unit(1), seq=1)
    recreated = doc("new puppy story", unit(1), seq=9)  # same session, after its delete (seq 5)
    await index.upsert([old, recreated])
    await index.delete_session("app-a", "alice", "s1", before_seq=5)
    assert await ids(index, q("puppy")) == [recreated.id]
    await index.delete_user("app-a", "alice", before_seq=5)
    assert await ids(index, q("puppy")) == [recreated.id]


async def test_delete_at_a_seq_takes_that_doc_of_that_session_only(index):
    forgotten = doc("puppy secret", unit(1), seq=3)
    kept = doc("puppy walk", unit(1), seq=4)
    other_session = doc("puppy park", unit(1), seq=3, session="s9")
    other_user = doc("puppy toy", unit(1), seq=3, user="bob")
    await index.upsert([forgotten, kept, other_session, other_user])
    await index.delete_session("app-a", "alice", "s1", at_seq=3)  # a forgotten event (memq's forget_event)
    assert set(await ids(index, q("puppy"))) == {kept.id, other_session.id}
    assert await ids(index, q("puppy", user="bob")) == [other_user.id]
    await index.delete_session("app-a", "alice", "s1", at_seq=3)  # again: nothing, no error


async def test_export_returns_docs_with_vectors(index):
    await index.upsert(CORPUS + [doc("bob", unit(1), seq=9, user="bob")])
    exported = {d.id: d for d in [d async for d in index.export(app="app-a", user="alice")]}
    assert set(exported) == {d.id for d in CORPUS}
    for d in CORPUS:
        got = exported[d.id]
        assert (got.text, got.search_text, got.seq, got.session, got.role) == (
            d.text,
            d.search_text,
            d.seq,
            d.session,
            d.role,
        )
        assert got.vector is not None and len(got.vector) == DIM
        assert max(abs(a - b) for a, b in zip(got.vector, d.vector)) < 1e-5
    assert len([d async for d in index.export()]) == len(CORPUS) + 1


async def test_a_new_generation_is_separate_until_promoted(index):
    await index.upsert(CORPUS)
    old = await index.live()
    fresh = await index.create_generation("test:other-model", DIM)
    assert fresh.generation != old.generation
    assert {g.generation for g in await index.generations()} >= {old.generation, fresh.generation}
    await index.upsert(CORPUS[:2], generation=fresh.generation)
    assert await index.count() == len(CORPUS)  # the live one still serves
    assert await index.count(generation=fresh.generation) == 2
    assert await ids(index, q("lisbon"), generation=fresh.generation) == [CORPUS[1].id]
    await index.promote(fresh.generation)
    live = await index.live()
    assert (live.generation, live.model) == (fresh.generation, "test:other-model")
    assert await index.count() == 2
    assert old.generation not in {g.generation for g in await index.generations()}  # dropped


async def test_a_generation_records_its_relevance_floor(index):
    assert (await index.live()).min_similarity is None  # created without one (as before issue 41)
    fresh = await index.create_generation("test:other-model", DIM, min_similarity=0.8)
    assert fresh.min_similarity == 0.8
    assert {g.generation: g.min_similarity for g in await index.generations()}[fresh.generation] == 0.8
    await index.promote(fresh.generation)
    assert (await index.live()).min_similarity == 0.8


async def test_an_abandoned_generation_can_be_dropped(index):
    fresh = await index.create_generation(MODEL, DIM)
    await index.upsert(CORPUS[:1], generation=fresh.generation)
    await index.drop_generation(fresh.generation)
    assert fresh.generation not in {g.generation for g in await index.generations()}
    assert (await index.live()).generation != fresh.generation


async def test_a_rare_word_wins_a_multi_word_keyword_query(index):
    # Weaviate before 1.38's fix (weaviate#11780) pruned recently inserted
    # docs of a rare term from limited multi-term BM25 queries: LoCoMo
    # keyword recall fell to 0.05. This is the shape of that failure.
    common = [doc(f"another ordinary day number {i}", unit(1), seq=i + 1) for i in range(300)]
    rare = doc("a zeppelin flew over on that day", unit(0, 1), seq=301)
    for i in range(0, len(common), 64):
        await index.upsert(common[i : i + 64])
    await index.upsert([rare])
    assert (await ids(index, q("zeppelin day", k=1))) == [rare.id]
    assert (await ids(index, q("day zeppelin", k=3)))[0] == rare.id


async def test_keyword_search_matches_inflections(index):
    # Porter stems: "research" finds "Researching", "painted" finds "paints";
    # the scope still holds (bob's inflection is never alice's hit).
    mine = doc("Researching adoption agencies this week", unit(1), seq=1)
    other = doc("My sister paints landscapes", unit(0, 1), seq=2)
    bobs = doc("Researched the same agencies", unit(1), seq=3, user="bob")
    await index.upsert([mine, other, bobs])
    assert await ids(index, q("What did she research?")) == [mine.id]
    assert await ids(index, q("who painted")) == [other.id]
    assert await ids(index, q("research", user="bob")) == [bobs.id]
    assert await ids(index, q("?!")) == []


async def test_a_keyword_only_generation_holds_docs_without_vectors(index):
    """``indexing.embedder = "none"``: a generation of dimension 0 stores
    text alone, searches it by BM25 and answers a hybrid query without a
    vector by keyword."""
    bare = [replace(d, vector=None) for d in CORPUS]
    keyword_only = await index.create_generation("none", 0)
    await index.upsert(bare, generation=keyword_only.generation)
    await index.promote(keyword_only.generation)
    live = await index.live()
    assert (live.generation, live.model, live.dim) == (keyword_only.generation, "none", 0)
    assert await index.count() == len(CORPUS)
    hits = await index.search(q("puppy"))
    assert {h.doc.id for h in hits} == {CORPUS[0].id, CORPUS[3].id}
    assert all(h.doc.vector is None for h in hits)
    assert await ids(index, q("puppy", mode="hybrid", k=1)) == [hits[0].doc.id]
    assert await ids(index, q("lisbon", roles=("assistant",))) == [CORPUS[1].id]
    exported = [d async for d in index.export()]
    assert {d.id for d in exported} == {d.id for d in CORPUS} and all(d.vector is None for d in exported)
    await index.delete_session("app-a", "alice", "s2")
    assert await ids(index, q("puppy")) == [CORPUS[0].id]


UNSPACED = [
    doc("我喜欢机器学习", unit(1), seq=1),  # Chinese: "I like machine learning"
    doc("私の名前は太郎です", unit(0, 1), seq=2),  # Japanese: "My name is Taro"
    doc("제 이름은 민수입니다", unit(0, 0, 1), seq=3),  # Korean: "My name is Minsu" (a particle glued on)
    doc("ผมชอบกินข้าวมาก", unit(0, 0, 0, 1), seq=4),  # Thai: "I like eating rice a lot"
    doc("私はPythonでADKを使っています", unit(0, 0, 0, 0, 1), seq=5),  # a Latin word inside Japanese
    doc("I like to code in Python.", unit(0, 0, 0, 0, 0, 1), seq=6),
]


@pytest.mark.parametrize(
    "word, found",
    [
        ("机器学习", [0]),  # inside unspaced Chinese
        ("学习", [0]),  # two characters: a trigram index would miss it
        ("太郎", [1]),
        ("名前", [1]),
        ("민수", [2]),  # the name without its particle
        ("ข้าว", [3]),  # Thai, with a vowel sign and a tone mark
        ("กิน", [3]),
        ("天気预报", []),  # shares no character pair with any text
        ("thon", []),  # a Latin fragment is not a word
    ],
)
async def test_a_word_inside_unspaced_text_is_found(index, word, found):
    await index.upsert(UNSPACED)
    assert await ids(index, q(word)) == [UNSPACED[i].id for i in found]


async def test_a_latin_word_glued_to_unspaced_text_is_found_and_english_is_still_stemmed(index):
    await index.upsert(UNSPACED + [doc("Researching adoption agencies", unit(1), seq=7)])
    assert set(await ids(index, q("python"))) == {UNSPACED[4].id, UNSPACED[5].id}
    assert await ids(index, q("ADK")) == [UNSPACED[4].id]
    assert await ids(index, q("research")) == [f"ev-app-a-alice-s1-{7}"]


def after(text: str, previous: tuple[str, str], vector: list[float], *, seq: int, **kw) -> Doc:
    """A doc indexed as the indexer makes one: with the session's previous turn."""
    d = doc(text, vector, seq=seq, **kw)
    return replace(d, search_text=search_text(d.author, text, d.timestamp, Turn(*previous)))


# Issue 40: each turn is indexed with the previous one, and on Weaviate "Python"
# ranked "Ich mag Käse" (after a turn about Python) at 1.0 above the turn that says it.
NEIGHBOURS = [
    doc("私はPythonでプログラムを書きます", unit(1), seq=1),
    after("Ich mag Käse", ("user", "私はPythonでプログラムを書きます"), unit(0, 1), seq=2),
    doc("I write Python every day at work", unit(0, 0, 1), seq=3, session="s2"),
    after("Nice.", ("user", "I write Python every day at work"), unit(0, 0, 0, 1), seq=4, session="s2"),
    after("Lovely weather today", ("user", "Nice."), unit(0, 0, 0, 0, 1), seq=5, session="s2"),
]


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
async def test_a_turn_that_says_the_words_ranks_above_the_turn_after_it(index, mode):
    await index.upsert(NEIGHBOURS)
    hits = await index.search(q("Python", mode=mode, vector=unit(0, 0, 0, 0, 0, 1), alpha=0.0))
    found = [h.doc.id for h in hits]
    own, followers = {NEIGHBOURS[0].id, NEIGHBOURS[2].id}, {NEIGHBOURS[1].id, NEIGHBOURS[3].id}
    assert set(found[:2]) == own, found
    assert followers <= set(found), found  # the previous turn still lets a turn be found
    score = {h.doc.id: h.scores["keyword"] for h in hits if "keyword" in h.scores}
    assert min(score[i] for i in own) > max(score[i] for i in followers), score
    # the doc comes back whole, with its previous turn (neighbours are found by it)
    assert {h.doc.id: h.doc.search_text for h in hits}[NEIGHBOURS[3].id] == NEIGHBOURS[3].search_text
