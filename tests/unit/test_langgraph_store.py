"""MemqStore's mapping of LangGraph items onto memq sessions, its filters and
namespace matching, and its bound on ops in flight: what needs no server."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.store.base import MatchCondition

from memq.contracts.adapters import langgraph as lg
from memq.contracts.adapters.langgraph import MemqStore, filter_matches, index_text, item_of, matches, session_of
from memq.contracts.errors import NotFound
from memq.contracts.queries import SearchResult, SearchResults

labels = st.text(min_size=1, max_size=12).filter(lambda s: "." not in s and "\x00" not in s)


@given(st.lists(labels, min_size=1, max_size=4).map(tuple), st.text(max_size=20))
def test_an_items_session_names_it_back(namespace, key):
    assert item_of(session_of(namespace, key)) == (namespace, key)


def test_other_sessions_are_not_items():
    for session in ["chat-1", "langgraph", "langgraph.x.a.k", "langgraph.0.k", "langgraph.2.a", "langgraph.2..b.k"]:
        assert item_of(session) is None
    assert item_of("langgraph.1.a.") == (("a",), "")


def test_a_name_memq_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="256 bytes"):
        session_of(("a",), "é" * 130)


def test_namespace_matching():
    ns = ("users", "alice", "v1")
    assert matches(ns, MatchCondition("prefix", ("users", "*")))
    assert matches(ns, MatchCondition("suffix", ("*", "v1")))
    assert not matches(ns, MatchCondition("prefix", ("alice",)))
    assert not matches(ns, MatchCondition("suffix", ("users", "alice", "v1", "x")))
    assert matches(ns, MatchCondition("prefix", ()))


def test_filters():
    value = {"n": 3, "tags": ["a", "b"], "user": {"level": "pro"}, "name": None}
    assert filter_matches(value, {"n": 3, "tags": ["a", "b"]})
    assert filter_matches(value, {"n": {"$gt": 2, "$lte": 3}, "user.level": "pro", "user": {"level": "pro"}})
    assert not filter_matches(value, {"n": {"$gt": 3}})
    assert not filter_matches(value, {"missing": {"$gt": 0}})  # no value is in no range
    assert filter_matches(value, {"missing": {"$ne": 1}})
    assert not filter_matches(value, {"tags": ["a"]})
    assert filter_matches(value, None)


def test_index_text():
    value = {"title": "garden", "body": {"lines": ["tomatoes", " "]}, "n": 4}
    assert index_text(value, None) == "garden\ntomatoes"
    assert index_text(value, ["title"]) == "garden"
    assert index_text(value, ["body.lines[*]", "n"]) == "tomatoes\n4"


class SlowClient:
    """A MemoryClient's reads, slow enough to see how many run at once."""

    app = "a"

    def __init__(self):
        self.now = self.most = 0

    async def get_state(self, user, session, **kwargs):
        self.now += 1
        self.most = max(self.most, self.now)
        await asyncio.sleep(0.01)
        self.now -= 1
        raise NotFound("no such session")


async def test_a_burst_of_ops_queues_in_the_store():
    """LangGraph's test_large_batches_async starts 3,000 ops at once: past the
    bound they wait in the store, not in memq's query service."""
    client = SlowClient()
    store = MemqStore(client)  # type: ignore[arg-type]
    found = await asyncio.gather(*(store.aget(("alice",), f"k{i}") for i in range(200)))
    assert found == [None] * 200
    assert client.most == lg.OPS_IN_FLIGHT


class ManyHits:
    """A client whose search finds 60 items, all of which exist: it counts the item reads."""

    app = "a"

    def __init__(self):
        self.reads = 0

    async def search(self, user, query, **kwargs):
        hits = [
            SearchResult(
                session_id=session_of(("alice",), f"k{n}"),
                event_id=f"e{n}",
                content="x",
                author="memory",
                timestamp=0.0,
                score=1.0 - n / 100,
            )
            for n in range(60)
        ]
        return SearchResults(results=hits, mode="keyword")

    async def get_state(self, user, session, **kwargs):
        self.reads += 1
        n = int(session.rsplit("k", 1)[1])
        return {"langgraph": {"value": {"n": n}, "created_at": 0.0, "updated_at": 0.0}}


async def test_a_page_of_hits_reads_about_a_page_of_values():
    client = ManyHits()
    store = MemqStore(client)  # type: ignore[arg-type]
    found = await store.asearch(("alice",), query="x", limit=2, offset=1)
    assert [(i.key, i.score) for i in found] == [("k1", 0.99), ("k2", 0.98)]
    assert client.reads == lg.READS  # one chunk, not the 60 hits
    odd = await store.asearch(("alice",), query="x", filter={"n": {"$gte": 20}}, limit=3)
    assert [i.key for i in odd] == ["k20", "k21", "k22"]
    assert client.reads == lg.READS + 2 * lg.READS  # read on until 3 passed the filter
