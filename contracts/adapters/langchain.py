"""LangChain's chat message history on memq (``pip install memq[langchain]``).

:class:`MemqChatMessageHistory` is a ``BaseChatMessageHistory``: one memq
session's messages, stored as memq events (so memq's history, summaries and
long-term memory see them) and read back as LangChain messages::

    history = MemqChatMessageHistory(memq, user="alice", session="chat-1")
    await history.aadd_messages([HumanMessage("Hi"), AIMessage("Hello!")])
    messages = await history.aget_messages()

Code written for the older ``RunnableWithMessageHistory`` (deprecated by
LangChain in favour of LangGraph's persistence) hands it a factory
``lambda session_id: MemqChatMessageHistory(memq, "alice", session_id)``.

With ``context=True`` the history is memq's budgeted context instead of
every message: recalled memories, the latest checkpoint summary and the
recent window that fit the strategy's token budget (as system, user,
assistant and tool messages).

The async methods (``aget_messages``, ``aadd_messages``, ``aclear``: what
``ainvoke`` uses) run on the client's event loop. The sync ones (``messages``,
``add_messages``, ``clear``: what ``invoke`` uses) hand the same work to that
loop and wait, so they work from any other thread (``invoke`` in a thread
pool, a sync web handler), never from inside the loop itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
    message_to_dict,
    messages_from_dict,
)

from memq.contracts.adapters.client_loop import ClientLoop
from memq.contracts.client import MemoryClient, Strategy
from memq.contracts.errors import NotFound
from memq.contracts.schemas import Event, Message, Part, TextPart, ToolCallPart, ToolResultPart, new_id

LANGCHAIN_KEY = "langchain"  # metadata: the message's own fields, for an exact read-back
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text" and b.get("text"))


def event_of(message: BaseMessage, default_author: str) -> Event:
    """The memq event that stores a LangChain message: its text, tool calls
    and tool result in memq's message, the rest (ids, kwargs, metadata) in
    ``metadata["langchain"]`` so that it reads back equal."""
    stored = message_to_dict(message)
    role = _ROLES.get(stored["type"], "user")
    parts: list[Part] = []
    text = _text(message.content)
    if isinstance(message, ToolMessage):
        parts.append(ToolResultPart(id=message.tool_call_id, name=message.name or "", result=text))
    elif text:
        parts.append(TextPart(text=text))
    for call in getattr(message, "tool_calls", None) or ():
        parts.append(ToolCallPart(id=call.get("id") or "", name=call["name"], args=call["args"]))
    data = dict(stored["data"])
    if isinstance(message.content, str) and role != "tool":
        del data["content"]  # the memq message holds it
    author = "user" if role == "user" else (message.name or default_author)
    return Event(
        id=message.id or new_id(),
        author=author,
        message=Message(role=role, parts=parts),
        metadata={LANGCHAIN_KEY: {"type": stored["type"], "data": data}},
    )


def message_of(stored_event: dict[str, Any]) -> BaseMessage | None:
    """The LangChain message of a stored memq event (``StoredEvent.event``);
    None for an event without a message. Events other producers appended are
    read from their memq message."""
    event = Event.model_validate(stored_event)
    if event.message is None:
        return None
    text = event.message.text
    kept = event.metadata.get(LANGCHAIN_KEY)
    if kept is not None:
        data = {"content": text, **kept["data"]}
        return messages_from_dict([{"type": kept["type"], "data": data}])[0]
    calls = [p for p in event.message.parts if isinstance(p, ToolCallPart)]
    role = event.message.role
    if role == "user":
        return HumanMessage(content=text, id=event.id)
    if role == "system":
        return SystemMessage(content=text, id=event.id)
    if role == "tool":
        result = next((p for p in event.message.parts if isinstance(p, ToolResultPart)), None)
        content = text or (str(result.result) if result is not None else "")
        return ToolMessage(content=content, tool_call_id=result.id if result else "", id=event.id)
    return AIMessage(
        content=text,
        id=event.id,
        tool_calls=[{"id": c.id or None, "name": c.name, "args": c.args} for c in calls],
    )


class MemqChatMessageHistory(BaseChatMessageHistory):
    """One memq session as a LangChain chat message history.

    :param client: the app's client (the caller keeps ownership of it).
    :param user: the user id.
    :param session: the session id (``RunnableWithMessageHistory``'s session id).
    :param context: read memq's budgeted context (recalled memories, summary,
        recent window within the strategy's budget) instead of every message.
        Default False.
    :param strategy: with ``context``: the working-memory strategy, e.g.
        ``{"kind": "token_window", "budget": 2000}``. Default: the app's.
    :param instruction: with ``context``: a system instruction template
        rendered from the session's state (``{user:name}``). Default: none.
    :param loop: the event loop the client runs on, for the sync methods.
        Default: the loop running when this object is made, or the one of
        its first async call; pass it when the object is made in another
        thread (a ``RunnableWithMessageHistory`` factory called by ``invoke``).
    """

    def __init__(
        self,
        client: MemoryClient,
        user: str,
        session: str,
        *,
        context: bool = False,
        strategy: Strategy = None,
        instruction: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.client = client
        self.user = user
        self.session = session
        self.context = context
        self.strategy = strategy
        self.instruction = instruction
        self._client_loop = ClientLoop(
            loop, owner="MemqChatMessageHistory", instead="ainvoke, aget_messages, aadd_messages"
        )

    # --- async: what ainvoke uses ------------------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        self._client_loop.remember()
        try:
            if self.context:
                ctx = await self.client.context(
                    self.user, self.session, format="openai", strategy=self.strategy, instruction=self.instruction
                )
                return convert_to_messages(ctx.messages)
            view = await self.client.get_session(self.user, self.session, events=True)
        except NotFound:  # nothing said yet
            return []
        return [m for e in view.events or () if (m := message_of(e.event)) is not None]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        self._client_loop.remember()
        events = [event_of(m, self.client.app) for m in messages]
        await self.client.append_many(self.user, self.session, events)

    async def aclear(self) -> None:
        """Delete the session everywhere (memq's delete: SQL, index, cache, stream).
        Clearing a history with nothing in it is a no-op, as in LangChain's own stores."""
        self._client_loop.remember()
        await self.client.delete_session(self.user, self.session, missing_ok=True)

    # --- sync: what invoke uses ------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # a read, as LangChain's own stores make it
        return self._client_loop.wait(self.aget_messages())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self._client_loop.wait(self.aadd_messages(messages))

    def clear(self) -> None:
        self._client_loop.wait(self.aclear())
