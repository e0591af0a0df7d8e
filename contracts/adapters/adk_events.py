"""ADK events as memq events and back (pure: no I/O).

memq's event model was made after ADK's, so most fields map one to one: id,
invocation id, author, branch, timestamp and the actions memq knows
(``state_delta``, ``artifact_delta``, ``transfer_to_agent``, ``escalate``,
``skip_summarization``). The content becomes memq's message (text, function
calls and responses, file references), which is what memq counts, indexes,
summarizes and puts in a context. What memq has no field for (ADK's other
actions, usage metadata, ``partial``, ``turn_complete``, …) travels in the
event's ``metadata["adk"]``, and so does the content itself whenever the
message cannot give it back exactly (thoughts, inline data, …): an ADK
event read back equals the one appended.

Events that other producers appended (no ``metadata["adk"]``) are read as
ADK events built from their message.
"""

from __future__ import annotations

from typing import Any

import orjson
from google.adk.events.event import Event as AdkEvent
from google.genai import types
from pydantic_core import to_jsonable_python

from memq.contracts.schemas import (
    Actions,
    DataPart,
    Event,
    FilePart,
    Message,
    Part,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    persisted_state,
)

ADK_KEY = "adk"  # where metadata keeps what memq's own fields cannot
_NATIVE = ("id", "invocation_id", "author", "timestamp")  # always carried by memq's own fields
_NATIVE_ACTIONS = ("state_delta", "artifact_delta", "transfer_to_agent", "escalate", "skip_summarization")


def json_safe(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict as JSON values. Rich values (datetimes, models) are
    converted faithfully; anything else becomes its string, as ADK's
    database service stores it rather than failing the write."""
    return to_jsonable_python(state, fallback=str)


def persisted_delta(delta: dict[str, Any]) -> dict[str, Any]:
    """A state delta without its ``temp:`` keys: those live for one invocation only
    (the schema drops them too; trimmed here before :func:`json_safe` converts the rest)."""
    return persisted_state(delta)


# --- content <-> message ------------------------------------------------------------


def message_of(content: types.Content | None, author: str) -> Message | None:
    """memq's message for an ADK content: its text (thoughts left out),
    function calls and responses, and file references. None if none of its
    parts has a memq counterpart."""
    if content is None or not content.parts:
        return None
    parts: list[Part] = []
    for part in content.parts:
        if part.text is not None and not part.thought:
            parts.append(TextPart(text=part.text))
        elif (call := part.function_call) is not None:
            parts.append(ToolCallPart(id=call.id or "", name=call.name or "", args=call.args or {}))
        elif (response := part.function_response) is not None:
            parts.append(ToolResultPart(id=response.id or "", name=response.name or "", result=response.response))
        elif (file := part.file_data) is not None and file.file_uri:
            parts.append(
                FilePart(uri=file.file_uri, mime_type=file.mime_type or FilePart.model_fields["mime_type"].default)
            )
    if not parts:
        return None
    if content.role == "model":
        role = "assistant"
    elif all(isinstance(p, ToolResultPart) for p in parts):
        role = "tool"  # ADK sends function responses back as the user's turn
    elif content.role == "user" or (content.role is None and author == "user"):
        role = "user"
    else:
        role = "assistant"
    return Message(role=role, parts=parts)


def content_of(message: Message | None) -> types.Content | None:
    """The ADK content of a memq message (the inverse of :func:`message_of`
    wherever it has one)."""
    if message is None or not message.parts:
        return None
    parts = []
    for part in message.parts:
        if isinstance(part, TextPart):
            parts.append(types.Part(text=part.text))
        elif isinstance(part, ToolCallPart):
            parts.append(
                types.Part(function_call=types.FunctionCall(id=part.id or None, name=part.name, args=part.args))
            )
        elif isinstance(part, ToolResultPart):
            result = part.result if isinstance(part.result, dict) else {"result": part.result}
            parts.append(
                types.Part(
                    function_response=types.FunctionResponse(id=part.id or None, name=part.name, response=result)
                )
            )
        elif isinstance(part, FilePart):
            parts.append(types.Part(file_data=types.FileData(file_uri=part.uri, mime_type=part.mime_type)))
        elif isinstance(part, DataPart):
            parts.append(types.Part(text=orjson.dumps(part.data).decode()))
    return types.Content(role="model" if message.role == "assistant" else "user", parts=parts)


def _without_defaults(fields: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    # Reading back fills defaults in: storing them would only make every event larger.
    return {k: v for k, v in fields.items() if k not in defaults or defaults[k] != v}


_DEFAULT = AdkEvent().model_dump(exclude_none=True, mode="json")


def _dump(model: Any) -> Any:
    return model.model_dump(exclude_none=True, mode="json") if model is not None else None


# --- events ----------------------------------------------------------------------------


def to_memq(event: AdkEvent) -> Event:
    """The memq event that stores ``event`` (already trimmed of ``temp:`` state)."""
    rest = event.model_dump(exclude_none=True, mode="json")
    for key in _NATIVE:
        rest.pop(key, None)
    if event.branch:  # None and "" are both memq's ""; keep "" apart in metadata
        rest.pop("branch")
    actions = rest.pop("actions", {})
    native_actions = {k: actions.pop(k) for k in _NATIVE_ACTIONS if k in actions}
    actions = _without_defaults(actions, _DEFAULT["actions"])
    rest = _without_defaults(rest, _DEFAULT)
    if actions:
        rest["actions"] = actions
    message = message_of(event.content, event.author)
    if _dump(content_of(message)) == rest.get("content"):
        rest.pop("content", None)  # the message gives it back exactly
    return Event(
        id=event.id,
        invocation_id=event.invocation_id,
        author=event.author,
        branch=event.branch or "",
        message=message,
        actions=Actions(**native_actions),
        timestamp=event.timestamp,
        metadata={ADK_KEY: rest} if rest else {},
    )


def from_memq(stored: dict[str, Any]) -> AdkEvent:
    """The ADK event of a stored memq event (``StoredEvent.event``)."""
    event = Event.model_validate(stored)
    rest = dict(event.metadata.get(ADK_KEY) or {})
    actions = {
        **rest.pop("actions", {}),
        **event.actions.model_dump(exclude_none=True, include=set(_NATIVE_ACTIONS)),
    }
    data: dict[str, Any] = {
        **rest,
        "id": event.id,
        "invocation_id": event.invocation_id,
        "author": event.author,
        "timestamp": event.timestamp,
        "actions": actions,
    }
    if event.branch:
        data["branch"] = event.branch
    if "content" not in data and (content := content_of(event.message)) is not None:
        data["content"] = content
    return AdkEvent.model_validate(data)
