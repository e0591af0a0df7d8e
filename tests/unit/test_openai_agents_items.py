"""The OpenAI Agents SDK's items as memq events (memq.contracts.adapters.openai_agents_items):
what memq's own reads see of each kind of item."""

from __future__ import annotations

import pytest

from memq.contracts.adapters.openai_agents_items import (
    event_of,
    item_of,
    message_of,
)
from memq.contracts.queries import StoredEvent
from memq.contracts.schemas import Event, Message, TextPart, ToolCallPart, ToolResultPart


def stored(event: Event, seq: int) -> StoredEvent:
    return StoredEvent(seq=seq, event=event.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("item", "role", "part"),
    [
        ({"role": "user", "content": "hi"}, "user", TextPart(text="hi")),
        ({"role": "developer", "content": "be brief"}, "system", TextPart(text="be brief")),
        (
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "no"}],
            },
            "assistant",
            TextPart(text="a\nno"),
        ),
        (
            {"type": "function_call", "call_id": "c1", "name": "book", "arguments": '{"city": "Lisbon"}'},
            "assistant",
            ToolCallPart(id="c1", name="book", args={"city": "Lisbon"}),
        ),
        (
            {"type": "function_call", "call_id": "c2", "name": "raw", "arguments": "not json"},
            "assistant",
            ToolCallPart(id="c2", name="raw", args={"arguments": "not json"}),
        ),
        (
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
            "tool",
            ToolResultPart(id="c1", result="ok"),
        ),
    ],
)
def test_memq_sees_text_tool_calls_and_results(item, role, part):
    assert message_of(item) == Message(role=role, parts=[part])


@pytest.mark.parametrize(
    "item",
    [
        {"type": "reasoning", "id": "rs", "summary": []},
        {"type": "web_search_call", "id": "ws", "status": "completed"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]},  # no text
    ],
)
def test_items_without_text_or_tool_meaning_have_no_memq_message(item):
    assert message_of(item) is None
    assert item_of(event_of(item, "app").model_dump(mode="json")) == item  # the SDK still reads it back


def test_the_user_authors_user_items_the_agent_the_rest():
    assert event_of({"role": "user", "content": "hi"}, "travel").author == "user"
    assert event_of({"role": "assistant", "content": "hello"}, "travel").author == "travel"


def test_events_of_other_writers_read_as_plain_messages():
    said = Event(author="user", message=Message(role="user", parts=[TextPart(text="from the client")]))
    result = Event(message=Message(role="tool", parts=[ToolResultPart(id="c", result="r")]))
    assert item_of(said.model_dump(mode="json")) == {"role": "user", "content": "from the client"}
    assert item_of(result.model_dump(mode="json")) is None  # a tool result without its call: not an item
    assert item_of(Event().model_dump(mode="json")) is None


def test_an_item_that_is_not_a_dict_is_refused():
    with pytest.raises(TypeError, match="a session item is a dict"):
        event_of("hi", "app")  # type: ignore[arg-type]
