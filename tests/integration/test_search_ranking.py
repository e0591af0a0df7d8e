"""The Searcher's ranking on a real index and embedder: a question that
names an author searches that author's memories without the name; a
"when" question lifts turns that state a time; filters and users hold."""

from __future__ import annotations

import pytest
from search_stack import open_index, searcher

from memq.contracts import queries as q
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.memory.recall import Doc, Turn, search_text
from memq.workers.query.search import Searcher
from memq.workers.settings import LocalEmbedderSettings

APP = "rank-app"
TS = 1_683_504_000.0

# Melanie names Caroline (and research) often; Caroline's own turn says what she researched.
TURNS = [
    ("s1", "Caroline", "Ha, thanks Melanie. I love painting sunsets by the lake."),
    ("s1", "Melanie", "Caroline, my research group asked about Caroline again. Caroline is famous!"),
    ("s2", "Caroline", "Researching adoption agencies this week, it has been a dream to have a family."),
    ("s2", "Melanie", "I love running, it keeps me fit and happy."),
    ("s3", "Melanie", "I ran a charity race for mental health last Saturday."),
    ("s3", "Caroline", "That is wonderful, Melanie, I am proud of you."),
]


@pytest.fixture(scope="module")
def embedder():
    return LocalEmbedder(LocalEmbedderSettings())


@pytest.fixture(params=["embedded", pytest.param("weaviate", marks=pytest.mark.services)])
async def backend(request, tmp_path, embedder):
    index = await open_index(request, request.param, tmp_path, embedder)
    docs = []
    for user in ("alice", "bob"):
        for i, (session, author, text) in enumerate(TURNS):
            before = TURNS[i - 1] if i else None
            previous = Turn(before[1], before[2]) if before and before[0] == session else None  # as the indexer does
            st = search_text(author, text, TS + 60 * i, previous)
            docs.append(Doc(f"{user}-{i}", APP, user, session, i + 1, author, "user", TS + 60 * i, text, st))
    vectors = await embedder.embed([d.search_text for d in docs])
    await index.upsert([d.with_vector(v) for d, v in zip(docs, vectors, strict=True)])
    try:
        yield index
    finally:
        await index.close()


async def found(searcher: Searcher, question: str, user: str = "alice", **kw) -> list[str]:
    reply = await searcher.search(q.Search(app=APP, user=user, query=question, k=3, **kw))
    return [r.event_id for r in reply.results]


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "vector"])
async def test_a_named_author_is_searched_without_the_name(backend, embedder, mode):
    ranked = await found(searcher(backend, embedder), "What did Caroline research?", mode=mode)
    assert ranked[0] == "alice-2"
    # one search alone lets the name-heavy turn by Melanie win: what the ranking fixes
    one = await found(searcher(backend, embedder, speaker_aware=False), "What did Caroline research?", mode=mode)
    assert one[0] != "alice-2"


async def test_a_when_question_lifts_the_turn_that_says_when(backend, embedder):
    async def scores(question: str, **recall) -> dict[str, float]:
        s = searcher(backend, embedder, **recall)
        reply = await s.search(q.Search(app=APP, user="alice", query=question, k=6))
        return {r.event_id: r.score for r in reply.results}

    when = "When did Melanie run a charity race?"
    lifted, plain = await scores(when), await scores(when, time_boost=0.0)
    assert max(lifted, key=lifted.__getitem__) == "alice-4"  # "… last Saturday"
    assert lifted["alice-4"] > plain["alice-4"]
    assert lifted["alice-3"] == pytest.approx(plain["alice-3"])  # says no time: no lift
    # not a when-question: the time boost changes nothing
    did = "Did Melanie run a charity race?"
    assert await scores(did) == pytest.approx(await scores(did, time_boost=0.0))


async def test_filters_and_users_hold_in_the_authors_search(backend, embedder):
    s = searcher(backend, embedder)
    assert set(await found(s, "What did Caroline research?", session="s1")) <= {"alice-0", "alice-1"}
    assert all(i.startswith("bob-") for i in await found(s, "What did Caroline research?", user="bob"))
    # an explicit authors filter is the caller's: no second search widens it
    assert set(await found(s, "What did Caroline research?", authors=["Melanie"])) <= {"alice-1", "alice-3", "alice-4"}


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: LocalEmbedder):
        self.inner, self.model, self.dim = inner, inner.model, inner.dim
        self.texts: list[str] = []

    async def embed(self, texts):
        self.texts += texts
        return await self.inner.embed(texts)


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
async def test_a_question_asked_again_is_embedded_once_and_answers_the_same(backend, embedder):
    counting = CountingEmbedder(embedder)
    question = "What did Caroline research?"
    first = await found(searcher(backend, counting), question)
    cached = searcher(backend, counting)
    answers = [await found(cached, question) for _ in range(3)]
    assert answers == [first] * 3
    # the question, and the same without the author's name: once each in the cached searcher
    assert len(counting.texts) == 4 and counting.texts[:2] == counting.texts[2:]
    off = searcher(backend, counting, vector_cache=0)
    await found(off, question)
    await found(off, question)
    assert len(counting.texts) == 8
