"""memq as LangChain's chat message history (memq.contracts.adapters.langchain),
against a real stack: RunnableWithMessageHistory with a fake chat model, the
sync and async methods, exact read-back of LangChain's messages, and the
budgeted context instead of every message."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from memq.contracts.adapters.langchain import MemqChatMessageHistory
from memq.contracts.client import MemoryClient

APP = "lc_app"

pytestmark = pytest.mark.timeout(300)


def chain_with_history(memq: MemoryClient, user: str, seen: list, **history_options) -> RunnableWithMessageHistory:
    """A prompt with the history, a recorder of what the model is sent, and a fake model."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{input}")]
    )

    def record(value):
        seen.append(value.to_messages())
        return value

    model = FakeListChatModel(responses=["Hello Ann!", "Your name is Ann.", "Bye!"])
    return RunnableWithMessageHistory(
        prompt | RunnableLambda(record) | model,
        lambda session_id: MemqChatMessageHistory(memq, user, session_id, **history_options),
        input_messages_key="input",
        history_messages_key="history",
    )


async def test_runnable_with_message_history_keeps_the_conversation(memq, user):
    seen: list = []
    chain = chain_with_history(memq, user, seen)
    config = {"configurable": {"session_id": "chat-1"}}
    assert (await chain.ainvoke({"input": "Hi, I am Ann."}, config)).content == "Hello Ann!"
    assert (await chain.ainvoke({"input": "What is my name?"}, config)).content == "Your name is Ann."
    # The second call was sent the first turn, read back from memq.
    assert [m.content for m in seen[1]] == ["Be brief.", "Hi, I am Ann.", "Hello Ann!", "What is my name?"]
    hist = await memq.history(user, "chat-1")
    assert [e.event["message"]["role"] for e in hist.events] == ["user", "assistant"] * 2
    assert hist.events[0].event["message"]["parts"][0]["text"] == "Hi, I am Ann."


async def test_sync_invoke_from_another_thread(memq, user):
    seen: list = []
    # invoke calls the history factory in its thread: the history is told the client's loop
    chain = chain_with_history(memq, user, seen, loop=asyncio.get_running_loop())
    config = {"configurable": {"session_id": "chat-sync"}}
    await asyncio.to_thread(chain.invoke, {"input": "Hi, I am Ann."}, config)
    reply = await asyncio.to_thread(chain.invoke, {"input": "What is my name?"}, config)
    assert reply.content == "Your name is Ann."
    assert [m.content for m in seen[1]][1:3] == ["Hi, I am Ann.", "Hello Ann!"]

    history = MemqChatMessageHistory(memq, user, "chat-sync")
    assert len(await asyncio.to_thread(lambda: history.messages)) == 4
    await asyncio.to_thread(history.clear)
    assert await history.aget_messages() == []


async def test_clearing_an_empty_history_is_a_no_op(memq, user):
    history = MemqChatMessageHistory(memq, user, "never-used")
    await history.aclear()  # as LangChain's own stores: nothing to clear is no error
    assert await history.aget_messages() == []


async def test_sync_methods_on_the_clients_own_loop_say_to_use_the_async_ones(memq, user):
    history = MemqChatMessageHistory(memq, user, "s")
    with pytest.raises(RuntimeError, match="use the async methods"):
        history.add_messages([HumanMessage("hi")])


async def test_messages_read_back_equal(memq, user):
    history = MemqChatMessageHistory(memq, user, "exact")
    messages = [
        SystemMessage("You help with trips."),
        HumanMessage("Book Lisbon", id="m-1", additional_kwargs={"lang": "en"}),
        AIMessage("", tool_calls=[{"id": "call-1", "name": "book", "args": {"city": "Lisbon"}}]),
        ToolMessage("booked", tool_call_id="call-1", name="book"),
        AIMessage([{"type": "text", "text": "Done: Lisbon."}], name="planner", response_metadata={"model": "x"}),
    ]
    await history.aadd_messages(messages)
    back = await history.aget_messages()
    assert [type(m) for m in back] == [type(m) for m in messages]
    assert [m.model_dump(exclude={"id"}) for m in back] == [m.model_dump(exclude={"id"}) for m in messages]
    assert back[1].id == "m-1"
    # memq sees the roles, the tool call and its result
    hist = await memq.history(user, "exact")
    kinds = [[p["type"] for p in e.event["message"]["parts"]] for e in hist.events]
    assert kinds == [["text"], ["text"], ["tool_call"], ["tool_result"], ["text"]]
    assert [e.event["author"] for e in hist.events][-1] == "planner"


async def test_context_option_returns_the_budgeted_context(memq, user):
    full = MemqChatMessageHistory(memq, user, "long")
    await full.aadd_messages(
        [HumanMessage(f"message {i}: " + "words " * 40) if i % 2 == 0 else AIMessage(f"reply {i}") for i in range(40)]
    )
    budgeted = MemqChatMessageHistory(
        memq, user, "long", context=True, strategy={"kind": "token_window", "budget": 300}, instruction="Be brief."
    )
    every = await full.aget_messages()
    window = await budgeted.aget_messages()
    assert len(every) == 40
    assert isinstance(window[0], SystemMessage) and window[0].content == "Be brief."
    assert 1 < len(window) < 40
    assert window[-1].content == "reply 39"  # the newest turns are kept
    assert await MemqChatMessageHistory(memq, user, "not-yet", context=True).aget_messages() == []
    ctx = await memq.context(user, "long", strategy={"kind": "token_window", "budget": 300})
    assert ctx.tokens["total"] <= 300
