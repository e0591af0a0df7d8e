"""memq's budgeted context for a LangGraph agent's model calls (``pip install memq[langgraph]``).

A LangGraph agent keeps its conversation in the graph's state, which grows
with every turn. :class:`MemqContext` stands between that state and the
model: its ``pre_model_hook`` stores the state's new messages in a memq
session (one per thread) and hands the model memq's context instead of the
whole state: recalled long-term memories, the latest checkpoint summary and
the recent turns that fit the strategy's token budget::

    memory = MemqContext(memq, strategy={"kind": "token_window", "budget": 2000})
    agent = create_react_agent(
        model, tools, pre_model_hook=memory.pre_model_hook, post_model_hook=memory.post_model_hook,
    )
    await agent.ainvoke({"messages": [("user", "hi")]},
                        {"configurable": {"thread_id": "s1", "user_id": "alice"}})

The memq user and session come from the run's config (``user_id`` and
``thread_id`` by default). The hook returns ``llm_input_messages``, which the
prebuilt agent sends to the model without touching the graph's own
``messages``. ``post_model_hook`` (optional) stores the model's reply at
once; without it, the reply is stored by the next model call's hook.

Messages are stored as the LangChain adapter stores them
(:func:`memq.contracts.adapters.langchain.event_of`: the message's id is the
event's), and a message is stored once: the hook stores the messages after
the last one the session's recent events hold (its newest 16 events, or as
many as the state has messages when none of those is one of them).

On a client made with ``local_reads=LocalWindows()`` and with
``recall_limit=0`` (no instruction, no facts), the hook's reads after its
own appends are answered in the client (:mod:`memq.contracts.local`): a
model call then costs the appends' publishes and no request.

Both hooks run sync and async: the async path (``ainvoke``, ``astream``) on
the client's loop, the sync path (``invoke``) by handing the work to that
loop from another thread, as :class:`~memq.contracts.adapters.langgraph.MemqStore` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_messages
from langchain_core.runnables import RunnableConfig, RunnableLambda

from memq.contracts.adapters.client_loop import ClientLoop
from memq.contracts.adapters.langchain import event_of
from memq.contracts.client import MemoryClient, Strategy
from memq.contracts.errors import NotFound

RECENT = 16  # the session's newest events read first to find what is stored


class MemqContext:
    """Hooks that keep a LangGraph agent's turns in memq and give its model memq's context.

    :param client: the app's client (the caller keeps ownership of it).
    :param strategy: the working-memory strategy, e.g.
        ``{"kind": "token_window", "budget": 2000}``. Default: the app's.
    :param instruction: a system instruction template rendered from the
        session's state (``{user:name}``). Default: none.
    :param recall_limit: long-term memories to recall, at most. Default 20.
    :param facts_limit: facts known about the user (memq's fact worker) to
        put before the recalled memories, at most. Default 0: none.
    :param user_key: the config key (``configurable``) that names the memq user. Default ``user_id``.
    :param session_key: the config key that names the memq session. Default ``thread_id``.
    :param loop: the event loop the client runs on, for sync runs. Default:
        the loop running when this object is made, or the one of its first async call.
    """

    def __init__(
        self,
        client: MemoryClient,
        *,
        strategy: Strategy = None,
        instruction: str | None = None,
        recall_limit: int = 20,
        facts_limit: int = 0,
        user_key: str = "user_id",
        session_key: str = "thread_id",
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.client = client
        self.strategy = strategy
        self.instruction = instruction
        self.recall_limit = recall_limit
        self.facts_limit = facts_limit
        self.user_key = user_key
        self.session_key = session_key
        self._client_loop = ClientLoop(loop, owner="MemqContext", instead="ainvoke or astream on the graph")
        self.pre_model_hook = RunnableLambda(self._pre_sync, afunc=self.aprepare, name="memq_context")
        self.post_model_hook = RunnableLambda(self._post_sync, afunc=self.asave, name="memq_save")

    def ids(self, config: RunnableConfig) -> tuple[str, str]:
        """The memq user and session a run's config names."""
        configurable = config.get("configurable") or {}
        missing = [k for k in (self.user_key, self.session_key) if not configurable.get(k)]
        if missing:
            raise ValueError(
                f"MemqContext needs {' and '.join(missing)} in the run's config "
                f"(config={{'configurable': {{'{self.user_key}': ..., '{self.session_key}': ...}}}})"
            )
        return str(configurable[self.user_key]), str(configurable[self.session_key])

    async def aprepare(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Store the state's new messages; return memq's context as ``llm_input_messages``."""
        self._client_loop.remember()
        user, session = self.ids(config)
        await self._store_new(user, session, _messages(state))
        ctx = await self.client.context(
            user,
            session,
            format="openai",
            strategy=self.strategy,
            instruction=self.instruction,
            recall_limit=self.recall_limit,
            facts_limit=self.facts_limit,
        )
        return {"llm_input_messages": convert_to_messages(ctx.messages)}

    async def asave(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Store the state's new messages (the model's reply); no state update."""
        self._client_loop.remember()
        await self._store_new(*self.ids(config), _messages(state))
        return {}

    async def _store_new(self, user: str, session: str, messages: Sequence[BaseMessage]) -> None:
        """Append the state's messages after the last one memq holds. The
        session's newest few events settle it in one small read when the hooks
        ran since the last model call; else the newest ``len(messages)``."""
        if not messages:
            return
        last = -1
        for window in sorted({min(len(messages), RECENT), len(messages)}):
            try:
                view = await self.client.get_session(user, session, num_recent_events=window)
            except NotFound:  # the thread's first turn
                break
            stored = {e.event["id"] for e in view.events or ()}
            last = max((i for i, m in enumerate(messages) if m.id in stored), default=-1)
            if last >= 0 or len(view.events or ()) < window:
                break  # found, or the session holds no more events than that
        new = messages[last + 1 :]
        if new:
            await self.client.append_many(user, session, [event_of(m, self.client.app) for m in new])

    def _pre_sync(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return self._client_loop.wait(self.aprepare(state, config))

    def _post_sync(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return self._client_loop.wait(self.asave(state, config))


def _messages(state: Any) -> list[BaseMessage]:
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)
    return convert_to_messages(messages or [])
