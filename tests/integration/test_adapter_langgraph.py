"""memq as LangGraph's store and an agent's context (memq.contracts.adapters.langgraph,
memq.contracts.adapters.langgraph_context), against a real stack: every store
op, search with and without a query, filters, pages, namespace listings,
read-your-writes across clients, bad input, isolation between apps and users,
and a prebuilt ReAct agent with a fake chat model whose model calls get memq's
context."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import AsyncIterator

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent as _create_react_agent
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore
from langgraph.warnings import LangGraphDeprecatedSinceV10

from memq.contracts.adapters.langgraph import MemqStore
from memq.contracts.adapters.langgraph_context import MemqContext
from memq.contracts.client import MemoryClient
from memq.workers.memory.local import LocalWindows

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def memq(memq_url: str) -> AsyncIterator[MemoryClient]:
    """A client of an app of its own: every test starts with an empty store."""
    async with await MemoryClient.connect(memq_url, app=f"lg_{uuid.uuid4().hex[:8]}") as client:
        yield client


@pytest.fixture
def store(memq: MemoryClient) -> MemqStore:
    return MemqStore(memq)


MEMORIES = ("alice", "memories")


async def test_put_get_delete(store, memq):
    assert await store.aget(MEMORIES, "food") is None
    await store.aput(MEMORIES, "food", {"text": "Alice likes pizza", "tags": ["food"], "n": 1})
    item = await store.aget(MEMORIES, "food")
    assert (item.namespace, item.key) == (MEMORIES, "food")
    assert item.value == {"text": "Alice likes pizza", "tags": ["food"], "n": 1}
    assert item.created_at == item.updated_at and item.created_at.tzinfo is not None
    # The item is a session of memq user alice.
    assert [s.session for s in (await memq.list_sessions("alice")).sessions] == ["langgraph.2.alice.memories.food"]
    await store.adelete(MEMORIES, "food")
    assert await store.aget(MEMORIES, "food") is None
    await store.adelete(MEMORIES, "food")  # deleting a missing item is a no-op, as in LangGraph's stores


async def test_keys_and_labels_that_need_escaping(store):
    namespace = ("alice", "notes 2026", "été")
    await store.aput(namespace, "a.b/c d", {"text": "dotted key"})
    assert (await store.aget(namespace, "a.b/c d")).value == {"text": "dotted key"}
    assert await store.aget(namespace, "a.b") is None
    assert await store.alist_namespaces() == [namespace]


async def test_a_put_replaces_the_item_and_its_indexed_text(store, memq):
    await store.aput(MEMORIES, "food", {"text": "Alice likes pizza"})
    first = await store.aget(MEMORIES, "food")
    await store.aput(MEMORIES, "food", {"text": "Alice prefers sushi now"})
    item = await store.aget(MEMORIES, "food")
    assert item.value == {"text": "Alice prefers sushi now"} and item.updated_at > first.updated_at
    assert await store.asearch(("alice",), query="pizza") == []
    assert [i.key for i in await store.asearch(("alice",), query="sushi")] == ["food"]
    # memq's own search (and so context recall) forgets the old text too.
    assert (await memq.search("alice", "pizza")).results == []


async def test_concurrent_puts_of_one_item_leave_one_version(memq_url, store, memq):
    """Each put deletes the item's session and writes the new one; puts that
    interleave (two processes) must not leave two versions, one of them
    searchable under the other's value."""
    async with await MemoryClient.connect(memq_url, app=memq.app) as other_client:
        other = MemqStore(other_client)
        words = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel"]
        await asyncio.gather(
            *((store if n % 2 else other).aput(MEMORIES, "fruit", {"text": f"likes {w}"}) for n, w in enumerate(words))
        )
    history = await memq.history("alice", "langgraph.2.alice.memories.fruit", consistency="any")
    assert len(history.events) == 1
    kept = (await store.aget(MEMORIES, "fruit")).value["text"]
    assert history.events[0].event["message"]["parts"][0]["text"] == kept
    found = {i.value["text"] for w in words for i in await store.asearch(("alice",), query=w)}
    assert found == {kept}


async def test_a_user_named_star_reads_only_its_own_items(memq, store):
    """``*`` in a search prefix is a label like any other, as in LangGraph's
    own stores: an app that builds namespaces from an end user's id must not
    let a user named ``*`` read everyone's items (issue 38, item 9). In
    ``list_namespaces``, LangGraph's stores take ``*`` as a wildcard, and so
    does this one."""
    items = [
        (("alice", "memories"), "food", {"text": "Alice likes pizza"}),
        (("bob", "memories"), "food", {"text": "Bob likes pizza too"}),
        (("*", "memories"), "food", {"text": "star likes pizza as well"}),
        (("carol", "*"), "note", {"text": "carol's pizza note"}),
    ]
    theirs = InMemoryStore()
    for namespace, key, value in items[:2]:
        await store.aput(namespace, key, value)
        await theirs.aput(namespace, key, value)
    for prefix in [("*", "memories"), ("*",), ("alice", "*")]:
        assert await theirs.asearch(prefix) == []  # LangGraph's own: nothing
        assert await store.asearch(prefix) == []
        assert await store.asearch(prefix, query="pizza") == []
    for namespace, key, value in items[2:]:
        await store.aput(namespace, key, value)
        await theirs.aput(namespace, key, value)
    for prefix, want in [(("*", "memories"), {"star likes pizza as well"}), (("carol", "*"), {"carol's pizza note"})]:
        assert {i.value["text"] for i in await theirs.asearch(prefix)} == want
        assert {i.value["text"] for i in await store.asearch(prefix)} == want
        assert {i.value["text"] for i in await store.asearch(prefix, query="pizza")} == want
    assert await store.asearch(("*",), query="pizza", filter={"text": "Alice likes pizza"}) == []
    # list_namespaces: `*` matches any one label, in LangGraph's store and here.
    listed = [("*", "memories"), ("alice", "memories"), ("bob", "memories")]
    assert await theirs.alist_namespaces(prefix=("*", "memories")) == listed
    assert await store.alist_namespaces(prefix=("*", "memories")) == listed


async def test_search_with_a_query_is_memqs_search_behind_its_relevance_floor(store):
    await store.aput(MEMORIES, "food", {"text": "Alice likes pizza with olives"})
    await store.aput(MEMORIES, "pet", {"text": "Alice has a cat named Tom"})
    await store.aput(("alice", "work"), "job", {"text": "Alice writes compilers"})
    found = await store.asearch(("alice",), query="which pizza")
    assert [i.key for i in found] == ["food"]
    assert found[0].score is not None and found[0].value == {"text": "Alice likes pizza with olives"}
    assert await store.asearch(("alice",), query="quantum chromodynamics") == []  # nothing related: nothing
    assert [i.key for i in await store.asearch(("alice", "work"), query="Alice")] == ["job"]  # the prefix
    both = await store.asearch(("alice",), query="Alice cat compilers", limit=10)
    assert {i.key for i in both} == {"food", "pet", "job"} or {i.key for i in both} >= {"pet", "job"}
    assert [i.key for i in await store.asearch(("alice",), query="Alice cat compilers", limit=1, offset=1)] == [
        both[1].key
    ]
    assert await store.asearch(("alice",), query="cat", filter={"text": "no such text"}) == []


async def test_what_is_indexed(store):
    await store.aput(MEMORIES, "quiet", {"text": "Alice hums jazz"}, index=False)
    await store.aput(MEMORIES, "titled", {"title": "garden", "body": "tomatoes"}, index=["title"])
    await store.aput(MEMORIES, "nested", {"facts": [{"text": "violin lessons"}], "kind": "hobby"})
    assert await store.asearch(("alice",), query="jazz") == []  # not indexed, but kept:
    assert (await store.aget(MEMORIES, "quiet")).value == {"text": "Alice hums jazz"}
    assert [i.key for i in await store.asearch(("alice",), query="garden")] == ["titled"]
    assert await store.asearch(("alice",), query="tomatoes") == []
    # Without fields, every string of the value is indexed, at any depth.
    assert [i.key for i in await store.asearch(("alice",), query="violin")] == ["nested"]
    assert [i.key for i in await store.asearch(("alice",), query="hobby")] == ["nested"]


async def test_the_stores_fields_apply_when_a_put_does_not_say(memq):
    store = MemqStore(memq, fields=["title"])
    await store.aput(MEMORIES, "a", {"title": "rowing", "body": "mornings"})
    assert [i.key for i in await store.asearch(("alice",), query="rowing")] == ["a"]
    assert await store.asearch(("alice",), query="mornings") == []


async def test_search_without_a_query_filters_and_pages(store):
    for n in range(5):
        await store.aput(("alice", "scores"), f"k{n}", {"n": n, "kind": "even" if n % 2 == 0 else "odd"})
    await store.aput(("alice", "other"), "x", {"n": 9})
    listed = await store.asearch(("alice", "scores"), limit=10)
    assert [i.key for i in listed] == ["k4", "k3", "k2", "k1", "k0"]  # most recently put first
    assert all(i.score is None for i in listed)
    assert [i.key for i in await store.asearch(("alice", "scores"), filter={"kind": "even"})] == ["k4", "k2", "k0"]
    assert [i.key for i in await store.asearch(("alice",), filter={"n": {"$gte": 3}})] == ["x", "k4", "k3"]
    assert [i.key for i in await store.asearch(("alice",), filter={"n": {"$ne": 9, "$lt": 2}})] == ["k1", "k0"]
    pages = [await store.asearch(("alice", "scores"), limit=2, offset=o) for o in (0, 2, 4)]
    assert [[i.key for i in p] for p in pages] == [["k4", "k3"], ["k2", "k1"], ["k0"]]
    assert [i.key for i in await store.asearch(("alice", "scores"), filter={"kind": "odd"}, limit=1, offset=1)] == [
        "k1"
    ]
    assert len(await store.asearch((), limit=100)) == 6  # the whole app


async def test_filters_reach_into_nested_values(store):
    """As LangGraph's SQL stores read them (its test_filter_keys_with_hyphens_and_digits)."""
    await store.aput(("docs",), "hyphen", {"access-level": "public", "user": {"access-level": "nested"}})
    await store.aput(("docs",), "dotted", {"user.access-level": "literal"})
    assert [i.key for i in await store.asearch(("docs",), filter={"access-level": "public"})] == ["hyphen"]
    assert [i.key for i in await store.asearch(("docs",), filter={"user.access-level": "nested"})] == ["hyphen"]
    assert [i.key for i in await store.asearch(("docs",), filter={"user.access-level": "literal"})] == ["dotted"]
    assert [i.key for i in await store.asearch(("docs",), filter={"user": {"access-level": "nested"}})] == ["hyphen"]


async def test_the_langgraph_root_label_is_reserved_by_put_only(store):
    """LangGraph's put refuses it; a batch (what LangGraph itself writes through) takes it."""
    await store.abatch([PutOp(("langgraph", "foo"), "bar", {"foo": "bar"})])
    assert (await store.aget(("langgraph", "foo"), "bar")).value == {"foo": "bar"}
    assert [i.key for i in await store.asearch(("langgraph",), query="bar")] == ["bar"]


async def test_list_namespaces(store):
    for namespace in [
        ("alice", "memories"),
        ("alice", "memories", "food"),
        ("alice", "prefs"),
        ("bob", "memories"),
        ("bob", "v1", "cache"),
        ("carol",),
    ]:
        await store.aput(namespace, "k", {"v": 1})
    assert await store.alist_namespaces() == [
        ("alice", "memories"),
        ("alice", "memories", "food"),
        ("alice", "prefs"),
        ("bob", "memories"),
        ("bob", "v1", "cache"),
        ("carol",),
    ]
    assert await store.alist_namespaces(prefix=("alice",)) == [
        ("alice", "memories"),
        ("alice", "memories", "food"),
        ("alice", "prefs"),
    ]
    assert await store.alist_namespaces(suffix=("memories",)) == [("alice", "memories"), ("bob", "memories")]
    assert await store.alist_namespaces(prefix=("*", "memories")) == [
        ("alice", "memories"),
        ("alice", "memories", "food"),
        ("bob", "memories"),
    ]
    assert await store.alist_namespaces(max_depth=1) == [("alice",), ("bob",), ("carol",)]
    assert await store.alist_namespaces(prefix=("bob",), suffix=("cache",)) == [("bob", "v1", "cache")]
    assert await store.alist_namespaces(limit=2, offset=1) == [("alice", "memories", "food"), ("alice", "prefs")]
    await store.adelete(("carol",), "k")
    assert ("carol",) not in await store.alist_namespaces()


async def test_a_batch_makes_its_puts_first_and_the_last_put_of_an_item_wins(store):
    results = await store.abatch(
        [
            GetOp(MEMORIES, "a"),
            PutOp(MEMORIES, "a", {"v": 1}),
            PutOp(MEMORIES, "a", {"v": 2}),
            SearchOp(("alice",), filter={"v": 2}),
            PutOp(MEMORIES, "b", {"v": 3}),
            PutOp(MEMORIES, "b", None),
        ]
    )
    assert results[0].value == {"v": 2}
    assert results[1:3] == [None, None]
    assert [i.key for i in results[3]] == ["a"]
    assert await store.aget(MEMORIES, "b") is None


async def test_reads_see_every_clients_writes(memq_url, store, memq):
    """Read-your-writes across processes: another client's store reads at once what this one wrote."""
    async with await MemoryClient.connect(memq_url, app=memq.app) as other_client:
        other = MemqStore(other_client)
        for n in range(3):
            await store.aput(MEMORIES, "food", {"text": f"Alice likes dish number {n} pasta"})
            assert (await other.aget(MEMORIES, "food")).value["text"].endswith(f"{n} pasta")
            assert [i.value["text"] for i in await other.asearch(("alice",), query="pasta")] == [
                f"Alice likes dish number {n} pasta"
            ]
        await store.adelete(MEMORIES, "food")
        assert await other.aget(MEMORIES, "food") is None
        assert await other.alist_namespaces() == []


async def test_bad_input_is_refused_before_anything_is_written(store):
    with pytest.raises(InvalidNamespaceError, match="periods"):
        await store.aput(("alice", "a.b"), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError, match="empty"):
        await store.abatch([PutOp((), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError, match="empty"):
        await store.aput(("alice", ""), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError, match="langgraph"):
        await store.aput(("langgraph", "x"), "k", {"v": 1})  # reserved by put, as in LangGraph's stores
    with pytest.raises(InvalidNamespaceError, match="strings"):
        await store.aget(("alice", 3), "k")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dict"):
        await store.abatch([PutOp(MEMORIES, "k", ["not", "a", "dict"])])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="256 bytes"):
        await store.aput(MEMORIES, "k" * 300, {"v": 1})
    with pytest.raises(NotImplementedError, match="TTL"):
        await store.aput(MEMORIES, "k", {"v": 1}, ttl=5)
    with pytest.raises(NotImplementedError, match="TTL"):
        await store.abatch([PutOp(MEMORIES, "k", {"v": 1}, ttl=5.0)])
    with pytest.raises(ValueError, match="operator"):
        await store.asearch(("alice",), filter={"v": {"$regex": "x"}})
    # A bad op anywhere in a batch: its good puts are not made either.
    with pytest.raises(TypeError):
        await store.abatch([PutOp(MEMORIES, "good", {"v": 1}), PutOp(MEMORIES, "bad", "text")])  # type: ignore[arg-type]
    assert await store.alist_namespaces() == []


async def test_a_namespace_needs_its_user_label(memq):
    store = MemqStore(memq, user_label=1)
    await store.aput(("memories", "alice"), "k", {"text": "kept for alice"})
    assert [s.user for s in (await memq.list_sessions()).sessions] == ["alice"]
    with pytest.raises(InvalidNamespaceError, match="label 1"):
        await store.aput(("memories",), "k", {"v": 1})
    assert [i.key for i in await store.asearch(("memories", "alice"), query="kept")] == ["k"]
    assert await store.asearch(("memories",), query="kept") == await store.asearch(("memories", "alice"), query="kept")


async def test_apps_are_isolated(memq_url, store):
    await store.aput(MEMORIES, "food", {"text": "Alice likes pizza"})
    async with await MemoryClient.connect(memq_url, app=f"other_{uuid.uuid4().hex[:8]}") as b_client:
        b = MemqStore(b_client)
        assert await b.aget(MEMORIES, "food") is None
        assert await b.asearch(("alice",), query="pizza") == []
        assert await b.asearch(("alice",)) == []
        assert await b.alist_namespaces() == []
        await b.aput(MEMORIES, "food", {"text": "B's own item"})
    assert (await store.aget(MEMORIES, "food")).value == {"text": "Alice likes pizza"}


async def test_users_are_isolated(memq, store):
    await store.aput(("alice", "memories"), "food", {"text": "Alice likes pizza"})
    await store.aput(("bob", "memories"), "food", {"text": "Bob likes pizza too"})
    bobs = MemqStore(memq, user="bob")  # a store for one user: every namespace is bob's
    assert (await bobs.aget(("alice", "memories"), "food")) is None  # that is bob's ("alice", "memories")
    assert [i.value["text"] for i in await bobs.asearch((), query="pizza")] == ["Bob likes pizza too"]
    await bobs.aput(("notes",), "n", {"text": "pizza on fridays"})
    assert {i.namespace for i in await bobs.asearch((), query="pizza")} == {("notes",), ("bob", "memories")}
    assert [(i.namespace, i.key) for i in await store.asearch(("alice",), query="pizza")] == [(MEMORIES, "food")]
    # memq's user delete takes the user's items with it.
    await memq.delete_user("alice")
    assert await store.aget(MEMORIES, "food") is None
    assert await store.alist_namespaces() == [("bob", "memories")]


async def test_memqs_context_recalls_store_items(store, memq):
    await store.aput(MEMORIES, "food", {"text": "Alice is allergic to peanuts"})
    await memq.append_text("alice", "chat-1", "user", "Hi there")
    # Recall searches what is indexed when it runs (it does not wait): a search does.
    assert await store.asearch(MEMORIES, query="peanuts")
    ctx = await memq.context("alice", "chat-1", format="openai", message="Can I eat peanuts?")
    assert any("allergic to peanuts" in m["content"] for m in ctx.messages if m["role"] == "system")


async def test_sync_methods_from_another_thread(memq):
    store = MemqStore(memq)  # made on the client's loop: its sync methods know it

    def sync_code() -> list:
        store.put(MEMORIES, "food", {"text": "Alice likes pizza"})
        return [
            store.get(MEMORIES, "food").value,
            [i.key for i in store.search(("alice",), query="pizza")],
            store.list_namespaces(),
        ]

    assert await asyncio.to_thread(sync_code) == [{"text": "Alice likes pizza"}, ["food"], [MEMORIES]]
    with pytest.raises(asyncio.InvalidStateError, match="async methods"):
        store.get(MEMORIES, "food")  # on the loop itself, waiting would block it


async def test_a_store_for_sync_code(memq_url):
    """MemqStore.connect: its own loop in a thread, for code with no loop at all."""

    def sync_code():
        with MemqStore.connect(memq_url, app=f"lg_{uuid.uuid4().hex[:8]}") as store:
            store.put(MEMORIES, "food", {"text": "Alice likes pizza"})
            found = [store.get(MEMORIES, "food").value, [i.key for i in store.search(("alice",), query="pizza")]]
            memory = MemqContext(store.client, loop=store.loop)
            agent = create_react_agent(
                fake_model(AIMessage("Hello Alice")),
                [weather],
                store=store,
                pre_model_hook=memory.pre_model_hook,
                post_model_hook=memory.post_model_hook,
            )
            config = {"configurable": {"thread_id": "chat", "user_id": "alice"}}
            found.append(agent.invoke({"messages": [("user", "hi")]}, config)["messages"][-1].content)
            events = asyncio.run_coroutine_threadsafe(store.client.history("alice", "chat"), store.loop).result()
            found.append(len(events.events))
            thread = store._thread
        return found, thread

    found, thread = await asyncio.to_thread(sync_code)  # the stack's workers run on this test's loop
    assert found == [{"text": "Alice likes pizza"}, ["food"], "Hello Alice", 2]
    assert not thread.is_alive()  # close() ended the loop it started


# --- an agent on memq ------------------------------------------------------------------


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel, its replies given, that records what it is sent and takes tools."""

    sent: list[list[BaseMessage]] = []

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.sent.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


def create_react_agent(*args, **kwargs):
    """LangGraph 1.x's prebuilt ReAct agent, without its notice that it moved
    to ``langchain.agents.create_agent`` (the langchain package, not a memq dependency)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        return _create_react_agent(*args, **kwargs)


def fake_model(*replies: AIMessage) -> ToolCallingFake:
    return ToolCallingFake(messages=iter(replies), sent=[])


TRIP = {"configurable": {"thread_id": "trip", "user_id": "ann"}}


def trip_agent(memory: MemqContext):
    """A ReAct agent with both hooks whose model asks for the weather, then
    answers twice; the model, to see what it was sent."""
    model = fake_model(
        AIMessage("", tool_calls=[{"id": "call-1", "name": "weather", "args": {"city": "Lisbon"}}]),
        AIMessage("It is sunny in Lisbon."),
        AIMessage("You asked about Lisbon."),
    )
    agent = create_react_agent(
        model,
        [weather],
        pre_model_hook=memory.pre_model_hook,
        post_model_hook=memory.post_model_hook,
        checkpointer=InMemorySaver(),
    )
    return agent, model


async def test_a_react_agent_gets_memqs_context_and_its_turns_are_stored(memq):
    agent, model = trip_agent(MemqContext(memq))
    config = TRIP
    await agent.ainvoke({"messages": [("user", "Weather in Lisbon?")]}, config)
    out = await agent.ainvoke({"messages": [("user", "What did I ask?")]}, config)
    assert out["messages"][-1].content == "You asked about Lisbon."
    # Each model call was sent memq's context: the turns so far, tool call and result included.
    assert [[m.type for m in sent] for sent in model.sent] == [
        ["human"],
        ["human", "ai", "tool"],
        ["human", "ai", "tool", "ai", "human"],
    ]
    assert model.sent[1][1].tool_calls[0]["args"] == {"city": "Lisbon"}
    # Every message of the graph's state is stored once, the final reply included (post_model_hook).
    history = await memq.history("ann", "trip")
    assert [e.event["id"] for e in history.events] == [m.id for m in out["messages"]]


async def test_with_local_windows_the_hooks_read_in_the_client(memq_url, memq):
    """On a client that holds its sessions' windows (``local_reads``), with a
    context of the window alone (``recall_limit=0``), the hooks' reads after
    their own appends are answered in the client, and the model is sent what
    the query service answers."""
    local = LocalWindows()
    async with await MemoryClient.connect(memq_url, app=memq.app, local_reads=local) as client:
        agent, model = trip_agent(MemqContext(client, recall_limit=0))
        config = TRIP
        await agent.ainvoke({"messages": [("user", "Weather in Lisbon?")]}, config)
        hits = local.hits
        await agent.ainvoke({"messages": [("user", "What did I ask?")]}, config)
        assert local.hits >= hits + 2  # the hook's get_session and its context
        answer = await memq.context("ann", "trip", format="openai", recall_limit=0, min_seq=client.last_seq)
    sent = [(m.type, m.content) for m in model.sent[-1]]
    assert sent == [(m.type, m.content) for m in convert_to_messages(answer.messages[:-1])]  # all but the final reply
    assert [m.type for m in model.sent[-1]] == ["human", "ai", "tool", "ai", "human"]


async def test_the_model_gets_the_budgeted_window_not_the_whole_state(memq):
    for n in range(12):
        await memq.append_text("ann", "long", "user" if n % 2 == 0 else "assistant", f"turn {n} " + "words " * 30)
    model = fake_model(AIMessage("ok"))
    memory = MemqContext(memq, strategy={"kind": "token_window", "budget": 200})
    agent = create_react_agent(model, [weather], pre_model_hook=memory.pre_model_hook)
    await agent.ainvoke({"messages": [("user", "and now?")]}, {"configurable": {"thread_id": "long", "user_id": "ann"}})
    sent = model.sent[0]
    assert sent[-1].content == "and now?"
    assert 1 < len(sent) < 13  # the newest turns that fit 200 tokens, not all 13
    assert "turn 11" in sent[-2].content


async def test_a_long_thread_is_stored_once_from_a_small_read(memq, monkeypatch):
    """The hook finds what memq holds in the session's newest events, not by
    reading as many events as the graph's state has messages."""
    windows = []
    get_session = memq.get_session

    async def recording(*args, **kwargs):
        windows.append(kwargs.get("num_recent_events"))
        return await get_session(*args, **kwargs)

    monkeypatch.setattr(memq, "get_session", recording)
    model = fake_model(AIMessage("first"), AIMessage("second"))
    memory = MemqContext(memq)
    agent = create_react_agent(model, [weather], pre_model_hook=memory.pre_model_hook, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "long-thread", "user_id": "ann"}}
    said = [("user" if n % 2 == 0 else "assistant", f"turn {n}") for n in range(40)]
    await agent.ainvoke({"messages": said}, config)
    windows.clear()
    out = await agent.ainvoke({"messages": [("user", "one more")]}, config)
    assert windows == [16]  # the state has 42 messages: the newest 16 events held the last stored one
    history = await memq.history("ann", "long-thread", strategy={"kind": "all"})
    assert [e.event["id"] for e in history.events] == [m.id for m in out["messages"][:-1]]  # the reply: next call


async def test_the_hooks_run_in_a_sync_graph_and_need_their_ids(memq):
    model = fake_model(AIMessage("hello"), AIMessage("again"))
    memory = MemqContext(memq)
    agent = create_react_agent(
        model, [weather], pre_model_hook=memory.pre_model_hook, post_model_hook=memory.post_model_hook
    )
    config = {"configurable": {"thread_id": "sync", "user_id": "ann"}}
    out = await asyncio.to_thread(agent.invoke, {"messages": [("user", "hi")]}, config)
    assert out["messages"][-1].content == "hello"
    assert [e.event["message"]["role"] for e in (await memq.history("ann", "sync")).events] == ["user", "assistant"]
    with pytest.raises(ValueError, match="user_id"):
        await agent.ainvoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "sync"}})
