"""memq as the OpenAI Agents SDK's session (memq.contracts.adapters.openai_agents),
against a real stack: a Runner with a small fake model holds a multi-turn
conversation (with a tool call) on memq, items read back equal, limit,
pop_item (durable, and race-free across writers), clear, isolation between
sessions, users and apps, two processes on one session, and bad input."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse
from agents.memory import Session, SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from memq.contracts import client as memq_client_module
from memq.contracts.adapters.openai_agents import MemqSession
from memq.contracts.client import MemoryClient
from memq.contracts.codec import encode, msg_id, subject_for
from memq.contracts.errors import InvalidMessage
from memq.contracts.schemas import CheckpointSaved
from memq.workers.memory.local import LocalWindows

APP = "oa_app"
NO_TRACES = RunConfig(tracing_disabled=True)

pytestmark = pytest.mark.timeout(300)


def said(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


def brief(item: dict) -> str:
    """An input item as a test reads it: who or what, and its text."""
    content = item.get("content")
    if isinstance(content, list):
        content = " ".join(part["text"] for part in content)
    if item.get("role"):
        return f"{item['role']}: {content}"
    return f"{item['type']}: {item.get('name') or item.get('output')}"


class Echo(Model):
    """Stands in for a real model (no network): asks for the weather tool
    when the last item asks about weather, else answers with the number of
    items it was sent (so a test sees the history grow). Records every input."""

    def __init__(self) -> None:
        self.inputs: list[list[dict]] = []

    async def get_response(self, system_instructions, input, *args, **kwargs) -> ModelResponse:
        items = [said("user", input)] if isinstance(input, str) else [dict(i) for i in input]
        self.inputs.append(items)
        last = items[-1]
        if "weather" in str(last.get("content", "")):
            out: Any = ResponseFunctionToolCall(
                type="function_call", call_id=f"call-{len(self.inputs)}", name="weather", arguments='{"city": "Lisbon"}'
            )
        else:
            text = f"{len(items)} items" + (f", tool said {last['output']}" if "output" in last else "")
            out = ResponseOutputMessage(
                id=f"msg-{len(self.inputs)}",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def test_memq_session_is_an_sdk_session(memq, user):
    assert isinstance(MemqSession("s", memq, user=user), Session)  # the SDK's runtime-checkable protocol


async def test_a_runner_holds_a_multi_turn_conversation_on_memq(memq, user):
    model = Echo()
    agent = Agent(name="guide", model=model, tools=[weather])
    session = MemqSession("trip", memq, user=user)
    first = await Runner.run(agent, "Lisbon in May?", session=session, run_config=NO_TRACES)
    assert first.final_output == "1 items"
    second = await Runner.run(agent, "And the weather?", session=session, run_config=NO_TRACES)
    assert second.final_output == "5 items, tool said sunny in Lisbon"
    third = await Runner.run(agent, "Thanks!", session=MemqSession("trip", memq, user=user), run_config=NO_TRACES)
    assert third.final_output == "7 items"
    # The last call was sent the whole conversation, read back from memq.
    assert [brief(i) for i in model.inputs[-1]] == [
        "user: Lisbon in May?",
        "assistant: 1 items",
        "user: And the weather?",
        "function_call: weather",
        "function_call_output: sunny in Lisbon",
        "assistant: 5 items, tool said sunny in Lisbon",
        "user: Thanks!",
    ]
    # memq's own reads see the turns: roles, the tool call and its result.
    hist = await memq.history(user, "trip", strategy={"kind": "all"})
    assert [e.event["message"]["role"] for e in hist.events] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    call = hist.events[3].event["message"]["parts"][0]
    assert (call["type"], call["name"], call["args"]) == ("tool_call", "weather", {"city": "Lisbon"})
    assert hist.events[4].event["message"]["parts"][0]["result"] == "sunny in Lisbon"
    assert [e.event["author"] for e in hist.events[:2]] == ["user", APP]


async def test_items_read_back_equal(memq, memq_url, user):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Olá, São Paulo 🌎"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "book", "arguments": '{"n": 2, "x": [1.5, null]}'},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Booked.", "annotations": [], "logprobs": []}],
        },
    ]
    session = MemqSession("exact", memq, user=user)
    await session.add_items(items)
    assert await session.get_items() == items
    # read by another client too (nothing comes from this one's memory)
    async with await MemoryClient.connect(memq_url, app=APP) as other:
        assert await MemqSession("exact", other, user=user).get_items() == items
    hist = await memq.history(user, "exact", strategy={"kind": "all"})
    roles = [(e.event.get("message") or {}).get("role") for e in hist.events]
    assert roles == ["system", "user", None, "assistant", "tool", "assistant"]  # reasoning: the SDK's alone


async def test_limit_gives_the_newest_items_in_order(memq, user):
    items = [said("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(7)]
    session = MemqSession("limited", memq, user=user)
    await session.add_items(items)
    assert await session.get_items(limit=3) == items[-3:]
    assert await session.get_items(limit=100) == items
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=-1) == items  # as SQLiteSession: negative is unlimited
    # beyond what memq reads by count: everything (the SDK's compaction session asks 2**31 - 1)
    assert await session.get_items(limit=2**31 - 1) == items
    assert await MemqSession("limited", memq, user=user, session_settings={"limit": 2}).get_items() == items[-2:]
    with_settings = MemqSession("limited", memq, user=user, session_settings=SessionSettings(limit=2))
    assert await with_settings.get_items(limit=4) == items[-4:]  # an explicit limit wins
    # a limit counts items, after the popped ones are forgotten
    await session.pop_item()
    await session.pop_item()
    assert await session.get_items(limit=3) == items[2:5]


async def test_pop_item_takes_back_the_newest_item_durably(memq, memq_url, user):
    session = MemqSession("pop", memq, user=user)
    assert await session.pop_item() is None  # never started
    items = [said("user", "a"), said("assistant", "b"), said("user", "c")]
    await session.add_items(items)
    assert await session.pop_item() == items[2]
    assert await session.get_items() == items[:2]
    async with await MemoryClient.connect(memq_url, app=APP) as other:  # another client, a new object
        again = MemqSession("pop", other, user=user)
        assert await again.get_items() == items[:2]
        assert await again.pop_item() == items[1]
    await session.add_items([said("user", "d")])
    assert await session.get_items() == [items[0], said("user", "d")]
    assert await session.pop_item() == said("user", "d")
    assert await session.pop_item() == items[0]
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_a_popped_item_is_forgotten_by_memq_itself(memq, memq_url, user):
    session = MemqSession("forgotten", memq, user=user)
    items = [said("user", "keep walrus"), said("assistant", "drop narwhal"), said("user", "keep otter")]
    await session.add_items(items)
    assert await session.pop_item() == items[2]
    assert await session.pop_item() == items[1]
    history = await memq.history(user, "forgotten", strategy={"kind": "all"}, consistency="any")
    assert [e.event["message"]["parts"][0]["text"] for e in history.events] == ["keep walrus"]
    context = await memq.context(user, "forgotten", strategy={"kind": "all"}, consistency="any")
    assert not any("narwhal" in str(m) or "otter" in str(m) for m in context.messages)
    hits = await memq.search(user, "narwhal", mode="keyword", min_seq=memq.last_seq)
    assert hits.results == []
    assert await session.get_items() == [items[0]]


async def test_concurrent_pops_never_take_the_same_item(memq, memq_url, user):
    items = [said("user", f"m{i}") for i in range(6)]
    await MemqSession("race", memq, user=user).add_items(items)
    async with await MemoryClient.connect(memq_url, app=APP) as other:
        a, b = MemqSession("race", memq, user=user), MemqSession("race", other, user=user)
        popped = await asyncio.gather(*(s.pop_item() for s in (a, b, a, b)))
    assert sorted(p["content"] for p in popped) == ["m2", "m3", "m4", "m5"]
    assert await a.get_items() == items[:2]


async def test_clear_session_removes_everything_and_the_session_starts_again(memq, user):
    session = MemqSession("clear", memq, user=user)
    await session.clear_session()  # nothing to clear: no error
    await session.add_items([said("user", "a"), said("assistant", "b")])
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    assert [s.session async for s in memq.iter_sessions(user, consistency="any")] == []
    await session.add_items([said("user", "again")])
    assert await session.get_items() == [said("user", "again")]


async def test_sessions_and_users_are_isolated(memq, user):
    one, two = MemqSession("one", memq, user=user), MemqSession("two", memq, user=user)
    someone_else = MemqSession("one", memq, user=f"{user}-other")
    await one.add_items([said("user", "in one")])
    await two.add_items([said("user", "in two")])
    assert await one.get_items() == [said("user", "in one")]
    assert await two.get_items() == [said("user", "in two")]
    assert await someone_else.get_items() == []
    assert await two.pop_item() == said("user", "in two")
    assert await one.get_items() == [said("user", "in one")]


async def test_another_apps_session_of_the_same_ids_is_not_seen(memq, memq_url, user):
    await MemqSession("shared-id", memq, user=user).add_items([said("user", "oa_app's")])
    async with await MemoryClient.connect(memq_url, app="other_app") as theirs:
        other = MemqSession("shared-id", theirs, user=user)
        assert await other.get_items() == []
        assert await other.pop_item() is None
        await other.add_items([said("user", "other_app's")])
        await other.clear_session()
    assert await MemqSession("shared-id", memq, user=user).get_items() == [said("user", "oa_app's")]


PROCESS_B = """
import asyncio, json, sys
from memq.contracts.adapters.openai_agents import MemqSession
from memq.contracts.client import MemoryClient

async def main(url, app, user, session_id):
    async with await MemoryClient.connect(url, app=app) as memq:
        session = MemqSession(session_id, memq, user=user)
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "add":
                await session.add_items([{"role": "user", "content": arg}])
                print("added", flush=True)
            elif command == "get":
                print(json.dumps(await session.get_items()), flush=True)
            elif command == "pop":
                print(json.dumps(await session.pop_item()), flush=True)
            else:
                return

asyncio.run(main(*sys.argv[1:]))
"""


async def test_two_processes_on_one_session_see_each_others_items(memq, memq_url, user):
    session = MemqSession("shared", memq, user=user)
    where = str(Path(memq_client_module.__file__).parents[2])  # B imports memq from where this process does
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")]))}
    b = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROCESS_B, memq_url, APP, user, "shared",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip

    async def tell_b(command: str) -> Any:
        b.stdin.write(f"{command}\n".encode())
        await b.stdin.drain()
        line = (await asyncio.wait_for(b.stdout.readline(), 60)).decode().strip()
        return line if line == "added" else json.loads(line)

    try:
        for i in range(5):
            await session.add_items([said("assistant", f"A{i}")])
            assert (await tell_b("get"))[-1] == said("assistant", f"A{i}")  # at once: no wait, no retry
            assert await tell_b(f"add B{i}") == "added"
            assert (await session.get_items())[-1] == said("user", f"B{i}")
        assert await tell_b("pop") == said("user", "B4")
        assert await session.pop_item() == said("assistant", "A4")
        assert await tell_b("get") == await session.get_items()
        b.stdin.write(b"quit\n")
        await b.stdin.drain()
        assert await asyncio.wait_for(b.wait(), 60) == 0
    finally:
        if b.returncode is None:
            b.kill()
    expected = [x for i in range(4) for x in (said("assistant", f"A{i}"), said("user", f"B{i}"))]
    assert await session.get_items() == expected


async def test_bad_items_store_nothing(memq, user):
    session = MemqSession("bad", memq, user=user)
    await session.add_items([said("user", "kept")])
    with pytest.raises(TypeError, match="a session item is a dict"):
        await session.add_items([said("user", "not stored"), "just text"])  # type: ignore[list-item]
    with pytest.raises((InvalidMessage, ValueError), match="64 bits"):
        await session.add_items([said("user", "not stored"), {"type": "x", "n": 2**70}])
    with pytest.raises((InvalidMessage, ValueError, TypeError)):
        await session.add_items([{"type": "x", "when": object()}])
    await session.add_items([])  # nothing to add: no error, nothing published
    assert await session.get_items() == [said("user", "kept")]


async def test_a_cancelled_write_still_stores_the_whole_batch(memq, user):
    """As the SDK's own sessions: cancelling add_items (a Runner cancelled
    mid-turn) raises CancelledError only once the write has its outcome,
    never with part of the batch published."""
    session = MemqSession("cancelled", memq, user=user)
    items = [said("user", f"m{i}") for i in range(300)]
    adding = asyncio.create_task(session.add_items(items))
    await asyncio.sleep(0.01)  # the first publishes are under way
    adding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await adding
    assert await session.get_items() == items
    popping = asyncio.create_task(session.pop_item())
    await asyncio.sleep(0)
    popping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await popping
    assert await session.get_items() == items[:-1]


async def test_pop_after_a_state_set_or_checkpoint_on_the_session(memq, user):
    """Messages that are not events (a state set, the summarizer's checkpoint)
    also move the session's last sequence: a pop after them still goes through."""
    session = MemqSession("moved", memq, user=user)
    items = [said("user", "a"), said("assistant", "b")]
    await session.add_items(items)
    await memq.set_state(user, {"step": 1}, session="moved")
    assert await session.pop_item() == items[1]
    checkpoint = CheckpointSaved(app=APP, user=user, session="moved", summary="a and b", up_to_seq=1)
    await memq.nc.jetstream().publish(
        subject_for(checkpoint), encode(checkpoint), headers={"Nats-Msg-Id": msg_id(checkpoint)}
    )
    assert await session.get_items() == items[:1]
    assert await session.pop_item() == items[0]


async def test_get_items_after_own_add_items_are_read_in_the_client(memq_url, user):
    """With local reads and ``consistency="own"``, a turn's ``add_items``
    (a few items: conditional appends one by one) keeps the window, and
    ``get_items`` after it is answered in the client: the items another
    client reads from the service."""
    local = LocalWindows()
    async with await MemoryClient.connect(memq_url, app=APP, local_reads=local) as client:
        session = MemqSession("held", client, user=user, consistency="own")
        items: list[dict[str, Any]] = []
        for turn in range(5):
            new = [said("user", f"q{turn}"), said("assistant", f"a{turn}")]
            await session.add_items(new)
            items += new
            assert await session.get_items() == items
            assert await session.get_items(limit=3) == items[-3:]
        assert local.hits >= 8  # all but the first turn's two reads
        async with await MemoryClient.connect(memq_url, app=APP) as other:
            assert await MemqSession("held", other, user=user).get_items() == items
