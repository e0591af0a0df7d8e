"""The OpenAI Agents SDK's input items as memq events, and back.

An item (a ``TResponseInputItem``: a JSON dict) is stored whole in the
event's ``metadata["openai_agents"]["item"]``, so it reads back equal; its
text, tool call or tool result is also the event's memq message, so memq's
history, context, summaries and long-term memory see the conversation as
they see any other. An item without such a meaning (reasoning, a hosted
tool's call) is stored with no message: only the SDK reads it back.

``pop_item`` forgets the popped item's event (memq's
:meth:`~memq.contracts.client.MemoryClient.forget_event`), so a popped item
is simply gone from what :func:`items_of` reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from memq.contracts.queries import StoredEvent
from memq.contracts.schemas import Event, Message, Part, TextPart, ToolCallPart, ToolResultPart

KEY = "openai_agents"  # metadata: {"item": <the item>}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, Mapping):
            text = part.get("text") if part.get("type") in _TEXT_PARTS else part.get("refusal")
            if isinstance(text, str) and text:
                texts.append(text)
    return "\n".join(texts)


def _args(arguments: Any) -> dict[str, Any]:
    """A function call's arguments (a JSON string) as memq's tool-call args
    (an object); anything else is kept under ``"arguments"``."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {} if arguments in (None, "") else {"arguments": arguments}


def message_of(item: Mapping[str, Any]) -> Message | None:
    """What memq's own reads see of an item: a message with its text, a
    function call, a function call's output; None for anything else."""
    kind, role = item.get("type"), item.get("role")
    parts: list[Part] = []
    if kind in (None, "message") and role in _ROLES:
        if text := _text(item.get("content")):
            parts.append(TextPart(text=text))
        return Message(role=_ROLES[role], parts=parts) if parts else None
    call_id = item.get("call_id")
    call_id = call_id if isinstance(call_id, str) else ""
    if kind == "function_call":
        name = item.get("name") if isinstance(item.get("name"), str) else ""
        parts.append(ToolCallPart(id=call_id, name=name, args=_args(item.get("arguments"))))
        return Message(role="assistant", parts=parts)
    if kind == "function_call_output":
        output = item.get("output")
        parts.append(ToolResultPart(id=call_id, result=output if isinstance(output, str) else _text(output)))
        return Message(role="tool", parts=parts)
    return None


def event_of(item: Mapping[str, Any], agent: str) -> Event:
    """The memq event that stores ``item``; ``agent`` is the author of what
    the user did not say. TypeError for an item that is not a dict."""
    if not isinstance(item, Mapping):
        raise TypeError(f"a session item is a dict (a TResponseInputItem), not {type(item).__name__}")
    message = message_of(item)
    author = "user" if message is not None and message.role == "user" else agent
    return Event(author=author, message=message, metadata={KEY: {"item": dict(item)}})


def item_of(stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """The item a stored event (``StoredEvent.event``) holds; None for an
    event with nothing to give. Events other writers
    appended (the memq client, ADK) come back as plain messages with their
    text: ``{"role": …, "content": …}``."""
    kept = (stored.get("metadata") or {}).get(KEY)
    if isinstance(kept, Mapping):
        item = kept.get("item")
        return dict(item) if isinstance(item, Mapping) else None
    message = Event.model_validate(stored).message
    if message is None or message.role == "tool" or not message.text:
        return None
    return {"role": message.role, "content": message.text}


def items_of(events: Iterable[StoredEvent]) -> list[tuple[StoredEvent, dict[str, Any]]]:
    """The items of ``events`` (oldest first), each with its event."""
    return [(e, item) for e in events if (item := item_of(e.event)) is not None]
