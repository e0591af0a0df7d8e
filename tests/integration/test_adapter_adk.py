"""memq as Google ADK's session and memory services (memq.contracts.adapters.adk).

Each test states one of ADK's documented session behaviours and runs it on
MemqSessionService against a real stack and on ADK's own
DatabaseSessionService (SQLite): the adapter behaves as ADK's does. Then an
ADK Runner with a tiny agent (a fake model, no network) holds a multi-turn
conversation on memq, and MemqMemoryService finds it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.memory import InMemoryMemoryService
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import DatabaseSessionService, InMemorySessionService, Session
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.genai import types

from memq.contracts import client as memq_client_module
from memq.contracts.adapters.adk import MemqMemoryService, MemqSessionService
from memq.contracts.client import MemoryClient
from memq.contracts.codec import encode, msg_id, subject_for
from memq.contracts.schemas import CheckpointSaved
from memq.workers.memory.local import LocalWindows

APP = "adk_app"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["memq", "memq-local", "adk-database"])
async def service(request, memq_url, tmp_path) -> AsyncIterator[BaseSessionService]:
    """The service under test: memq's (``memq-local``: reads after its own
    appends answered in the client, memq.contracts.local), or ADK's own on
    SQLite (the reference)."""
    if request.param == "memq":
        async with await MemoryClient.connect(memq_url, app=APP) as client:
            yield MemqSessionService(client)
    elif request.param == "memq-local":
        async with await MemoryClient.connect(memq_url, app=APP, local_reads=LocalWindows()) as client:
            yield MemqSessionService(client, consistency="own")
    else:
        async with DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path}/adk.db") as db:
            yield db


def said(author: str, text: str, **fields) -> Event:
    role = "user" if author == "user" else "model"
    return Event(
        author=author,
        invocation_id="inv-1",
        content=types.Content(role=role, parts=[types.Part(text=text)]),
        **fields,
    )


def mine(state: dict, user: str) -> dict:
    """A state without the app: keys of the module's other tests."""
    return {k: v for k, v in state.items() if not k.startswith("app:") or k == f"app:{user}"}


def texts(events: list[Event]) -> list[str]:
    return [e.content.parts[0].text for e in events if e.content and e.content.parts]


async def test_create_session_generates_an_id_and_keeps_the_state_but_temp(service, user):
    session = await service.create_session(app_name=APP, user_id=user, state={"topic": "x", "temp:scratch": 1})
    assert session.id and session.app_name == APP and session.user_id == user
    assert session.state == {"topic": "x"} and session.events == []
    got = await service.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert got.id == session.id and got.state == {"topic": "x"} and got.events == []


async def test_create_session_with_a_taken_id_raises_already_exists(service, user):
    await service.create_session(app_name=APP, user_id=user, session_id="s1")
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id=user, session_id="s1")


async def test_get_session_of_an_unknown_session_is_none(service, user):
    assert await service.get_session(app_name=APP, user_id=user, session_id="nope") is None


async def test_state_scopes_app_user_session(service, user):
    other = f"{user}-other"
    app_key = f"app:{user}"  # app state is shared by the module's tests: a key of this test's own
    first = await service.create_session(app_name=APP, user_id=user, state={"k": 1, "user:lang": "fr", app_key: 3})
    assert mine(first.state, user) == {"k": 1, "user:lang": "fr", app_key: 3}
    second = await service.create_session(app_name=APP, user_id=user)
    assert mine(second.state, user) == {"user:lang": "fr", app_key: 3}  # session keys stay in their session
    theirs = await service.create_session(app_name=APP, user_id=other)
    assert mine(theirs.state, user) == {app_key: 3}  # user keys stay with their user
    assert await service.get_user_state(app_name=APP, user_id=user) == {"lang": "fr"}


async def test_append_event_applies_and_stores_the_delta_but_temp(service, user):
    session = await service.create_session(app_name=APP, user_id=user)
    event = said("agent", "noted", actions=EventActions(state_delta={"step": 2, "user:plan": "pro", "temp:draft": "d"}))
    await service.append_event(session, event)
    # temp: lives in the in-memory session for this invocation, and is trimmed from the stored event
    assert mine(session.state, user) == {"step": 2, "user:plan": "pro", "temp:draft": "d"}
    assert event.actions.state_delta == {"step": 2, "user:plan": "pro"}
    got = await service.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert mine(got.state, user) == {"step": 2, "user:plan": "pro"}
    assert got.events[0].actions.state_delta == {"step": 2, "user:plan": "pro"}
    # user: state reaches the user's other sessions
    other = await service.create_session(app_name=APP, user_id=user)
    assert mine(other.state, user) == {"user:plan": "pro"}


async def test_events_come_back_as_appended_in_order(service, user):
    session = await service.create_session(app_name=APP, user_id=user)
    hello = said("user", "hello")
    call = Event(
        author="agent",
        content=types.Content(
            role="model", parts=[types.Part(function_call=types.FunctionCall(id="c1", name="lookup", args={"q": 1}))]
        ),
    )
    reply = Event(
        author="agent",
        content=types.Content(
            role="user",
            parts=[types.Part(function_response=types.FunctionResponse(id="c1", name="lookup", response={"r": 2}))],
        ),
    )
    thought = said("agent", "done", branch="root.sub", turn_complete=True)
    thought.content.parts.insert(0, types.Part(text="thinking", thought=True))
    escalation = Event(author="agent", actions=EventActions(escalate=True))
    appended = [hello, call, reply, thought, escalation]  # made in this order: ADK's database orders by timestamp
    for event in appended:
        await service.append_event(session, event)
    got = await service.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert got.events == appended
    assert got.events == session.events


async def test_get_session_config_num_recent_events_and_after_timestamp(service, user):
    session = await service.create_session(app_name=APP, user_id=user)
    start = time.time()
    for i in range(5):
        await service.append_event(session, said("user", f"turn {i}", timestamp=start + i))

    async def read(**config) -> list[str]:
        got = await service.get_session(
            app_name=APP, user_id=user, session_id=session.id, config=GetSessionConfig(**config)
        )
        return texts(got.events)

    assert await read(num_recent_events=2) == ["turn 3", "turn 4"]
    assert await read(num_recent_events=0) == []
    assert await read(after_timestamp=start + 3) == ["turn 3", "turn 4"]  # at or after
    assert await read(after_timestamp=start + 1, num_recent_events=2) == ["turn 3", "turn 4"]
    assert await read(num_recent_events=100) == [f"turn {i}" for i in range(5)]
    with pytest.raises(ValueError):
        GetSessionConfig(num_recent_events=-1)


async def test_list_sessions_oldest_update_first_with_state_without_events(service, user):
    first = await service.create_session(app_name=APP, user_id=user, state={"n": 1, "user:lang": "fr"})
    second = await service.create_session(app_name=APP, user_id=user, state={"n": 2})
    await service.append_event(first, said("user", "bump", timestamp=time.time() + 5))  # now the newest
    other = await service.create_session(app_name=APP, user_id=f"{user}-b")

    listed = (await service.list_sessions(app_name=APP, user_id=user)).sessions
    assert [s.id for s in listed] == [second.id, first.id]
    assert [mine(s.state, user) for s in listed] == [{"n": 2, "user:lang": "fr"}, {"n": 1, "user:lang": "fr"}]
    assert all(s.events == [] for s in listed)
    everyone = {s.id for s in (await service.list_sessions(app_name=APP)).sessions}
    assert {first.id, second.id, other.id} <= everyone


async def test_delete_session_removes_it_and_deleting_again_is_harmless(service, user):
    session = await service.create_session(app_name=APP, user_id=user)
    await service.append_event(session, said("user", "bye"))
    await service.delete_session(app_name=APP, user_id=user, session_id=session.id)
    assert await service.get_session(app_name=APP, user_id=user, session_id=session.id) is None
    assert (await service.list_sessions(app_name=APP, user_id=user)).sessions == []
    await service.delete_session(app_name=APP, user_id=user, session_id=session.id)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, said("user", "anyone there?"))


async def test_appending_to_a_session_never_created_raises_not_found(service, user):
    # A typo in a session id must not start a conversation (memq's create=False).
    ghost = Session(id="never-created", app_name=APP, user_id=user)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(ghost, said("user", "hello?"))
    assert await service.get_session(app_name=APP, user_id=user, session_id="never-created") is None
    await service.delete_session(app_name=APP, user_id=user, session_id="never-created")  # a no-op, as ADK's


async def test_appending_to_a_stale_session_raises_until_reloaded(service, user):
    created = await service.create_session(app_name=APP, user_id=user)
    mine = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
    theirs = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
    await service.append_event(theirs, said("user", "first"))
    with pytest.raises(StaleSessionError):
        await service.append_event(mine, said("user", "second"))
    mine = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
    await service.append_event(mine, said("user", "second"))
    # the writer's own session object follows its appends
    await service.append_event(mine, said("user", "third"))
    got = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
    assert texts(got.events) == ["first", "second", "third"]


async def test_a_session_loaded_with_a_config_is_stale_after_another_append(service, user):
    created = await service.create_session(app_name=APP, user_id=user)
    await service.append_event(created, said("user", "one"))
    window = await service.get_session(
        app_name=APP, user_id=user, session_id=created.id, config=GetSessionConfig(num_recent_events=0)
    )
    await service.append_event(window, said("user", "two"))  # nothing newer than it was loaded at
    with pytest.raises(StaleSessionError):  # "two" came after created's own append
        await service.append_event(created, said("user", "three"))
    current = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
    await service.append_event(current, said("user", "three"))
    with pytest.raises(StaleSessionError):
        await service.append_event(window, said("user", "four"))


async def test_partial_events_are_not_stored(service, user):
    session = await service.create_session(app_name=APP, user_id=user)
    await service.append_event(session, said("agent", "strea", partial=True))
    await service.append_event(session, said("agent", "streamed"))
    got = await service.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert texts(got.events) == ["streamed"]


async def test_last_update_time_is_the_appended_events_timestamp_even_an_older_one(service, user):
    session = await service.create_session(app_name=APP, user_id=user)
    now = time.time()
    await service.append_event(session, said("user", "from the future", timestamp=now + 100))
    await service.append_event(session, said("user", "from the past", timestamp=now - 1000))  # appended last
    past = pytest.approx(now - 1000, abs=1e-6)  # ADK's database keeps microseconds
    assert session.last_update_time == past
    got = await service.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert got.last_update_time == past
    (listed,) = (await service.list_sessions(app_name=APP, user_id=user)).sessions
    assert listed.last_update_time == past


# --- memq only -------------------------------------------------------------------------


async def test_another_app_name_is_refused(memq, user):
    service = MemqSessionService(memq)
    with pytest.raises(ValueError, match="speaks for app 'adk_app', not 'other_app'.*from_url"):
        await service.create_session(app_name="other_app", user_id=user)
    by_app = MemqSessionService({APP: memq})
    with pytest.raises(ValueError, match="no MemoryClient for app 'other_app' .*'adk_app'"):
        await by_app.get_user_state(app_name="other_app", user_id=user)
    with pytest.raises(ValueError, match="speaks for app"):
        await MemqMemoryService(memq).search_memory(app_name="other_app", user_id=user, query="x")


async def test_one_service_serves_several_apps(memq_url, user):
    """As ADK's own services do (its test_get_user_state_is_not_visible_across_apps):
    each app_name is its own app, through a client per app connected on first use."""
    async with MemqSessionService.from_url(memq_url) as service:
        mine = await service.create_session(app_name=APP, user_id=user, state={"user:plan": "pro"})
        await service.append_event(mine, said("user", "in adk_app", actions=EventActions(state_delta={"user:x": 1})))
        theirs = await service.create_session(app_name="other_app", user_id=user, state={"k": "v"})
        await service.append_event(theirs, said("user", "in other_app"))
        assert await service.get_user_state(app_name=APP, user_id=user) == {"plan": "pro", "x": 1}
        assert await service.get_user_state(app_name="other_app", user_id=user) == {}
        assert [s.id for s in (await service.list_sessions(app_name="other_app", user_id=user)).sessions] == [theirs.id]
        assert await service.get_session(app_name="other_app", user_id=user, session_id=mine.id) is None
        got = await service.get_session(app_name="other_app", user_id=user, session_id=theirs.id)
        assert texts(got.events) == ["in other_app"] and got.app_name == "other_app" and got.state == {"k": "v"}
        clients = [await service.client_for(APP), await service.client_for("other_app")]
        assert [c.app for c in clients] == [APP, "other_app"] and clients[0] is await service.client_for(APP)
        # A memory service on the same connections.
        memory = MemqMemoryService(service.client_for, mode="keyword")
        other = clients[1]
        await other.search(user, "x", min_seq=other.last_seq)  # waits until indexed
        found = await memory.search_memory(app_name="other_app", user_id=user, query="other_app")
        assert texts_of(found) == ["in other_app"]
    assert all(c.nc.is_closed for c in clients)  # the service connected them: it closed them


async def test_appends_after_a_checkpoint_state_or_artifact_go_through(memq, memq_url, user):
    """Messages that are not events (the summarizer's checkpoints, state
    sets, artifacts) move the session's last sequence, not its events: an
    append to a copy loaded before them is made again after them."""
    service = MemqSessionService(memq)
    session = await service.create_session(app_name=APP, user_id=user)
    first = await service.append_event(session, said("user", "one"))
    async with await MemoryClient.connect(memq_url, app=APP) as other:  # another writer, its own connection
        await other.set_state(user, {"note": 1}, session=session.id)
        await other.save_artifact(user, session.id, "a.txt", b"data")
        checkpoint = CheckpointSaved(app=APP, user=user, session=session.id, summary="one", up_to_seq=1)
        await other.nc.jetstream().publish(
            subject_for(checkpoint), encode(checkpoint), headers={"Nats-Msg-Id": msg_id(checkpoint)}
        )
    await service.append_event(session, said("user", "two"))
    await service.append_event(session, said("user", "three"))  # after its own append: no conflict
    got = await service.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert texts(got.events) == ["one", "two", "three"] and got.events[0].id == first.id
    assert mine(got.state, user) == {"note": 1}
    assert got == session.model_copy(update={"state": got.state})  # same events, time and revision


# B, a second ADK service in its own OS process with its own connection: on
# "load" it loads the session, on "append" appends to that copy and says
# whether ADK's StaleSessionError came back.
REPLICA_B = """
import asyncio, sys
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.genai import types
from memq.contracts.adapters.adk import MemqSessionService
from memq.contracts.client import MemoryClient

async def main(url, app, user, session_id):
    loop = asyncio.get_running_loop()
    line = lambda: loop.run_in_executor(None, sys.stdin.readline)
    async with await MemoryClient.connect(url, app=app) as client:
        service = MemqSessionService(client)
        while (await line()).strip() == "load":
            session = await service.get_session(app_name=app, user_id=user, session_id=session_id)
            print("loaded", flush=True)
            await line()
            event = Event(author="user", content=types.Content(role="user", parts=[types.Part(text="B")]))
            try:
                await service.append_event(session, event)
                print("accepted", flush=True)
            except StaleSessionError:
                print("stale", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_copy_loaded_before_another_replicas_append_is_stale(memq, memq_url, user):
    """Two ADK Runner replicas (two processes) on one session: B appends to a
    copy it loaded before A's append. ADK's DatabaseSessionService refuses
    it every time; so must memq, with no read before the append."""
    service = MemqSessionService(memq)
    created = await service.create_session(app_name=APP, user_id=user)
    where = str(Path(memq_client_module.__file__).parents[2])  # B imports memq from where this process does
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")]))}
    b = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        REPLICA_B,
        memq_url,
        APP,
        user,
        created.id,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )

    async def tell_b(command: str) -> str:
        b.stdin.write(f"{command}\n".encode())
        await b.stdin.drain()
        return (await asyncio.wait_for(b.stdout.readline(), 60)).decode().strip()

    outcomes = []
    try:
        for i in range(30):
            assert await tell_b("load") == "loaded"
            current = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
            await service.append_event(current, said("user", f"A{i}"))
            outcomes.append(await tell_b("append"))
        b.stdin.write(b"quit\n")
        await b.stdin.drain()
        assert await asyncio.wait_for(b.wait(), 60) == 0
    finally:
        if b.returncode is None:
            b.kill()
    assert outcomes == ["stale"] * 30
    got = await service.get_session(app_name=APP, user_id=user, session_id=created.id)
    assert texts(got.events) == [f"A{i}" for i in range(30)]


async def test_adk_events_are_memq_events(memq, user):
    """memq's own reads see an ADK conversation: history, context and search."""
    service = MemqSessionService(memq)
    session = await service.create_session(app_name=APP, user_id=user)
    await service.append_event(session, said("user", "My sister Carla is allergic to peanuts."))
    await service.append_event(session, said("helper", "Noted: no peanuts for Carla."))
    hist = await memq.history(user, session.id)
    assert [(e.event["author"], e.event["message"]["role"]) for e in hist.events] == [
        ("user", "user"),
        ("helper", "assistant"),
    ]
    ctx = await memq.context(user, session.id, format="openai")
    assert [m["role"] for m in ctx.messages][-2:] == ["user", "assistant"]


class ScriptedLlm(BaseLlm):
    """A fake model: answers with how many contents it was sent and the last
    user text, so the test sees what history the agent was given."""

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False):
        last = llm_request.contents[-1].parts[0].text
        yield LlmResponse(
            content=types.Content(
                role="model", parts=[types.Part(text=f"[{len(llm_request.contents)}] you said {last}")]
            )
        )


async def three_turns(runner: Runner, user: str, session_id: str) -> list[str]:
    """The echo agent's replies to three user turns run through ``runner``."""
    replies = []
    for text in ("hello", "pineapple pizza please", "thanks"):
        message = types.Content(role="user", parts=[types.Part(text=text)])
        async for event in runner.run_async(user_id=user, session_id=session_id, new_message=message):
            if event.content and event.author == "echo":
                replies.append(event.content.parts[0].text)
    return replies


async def test_a_runner_holds_a_multi_turn_conversation_on_memq(memq, user):
    agent = LlmAgent(name="echo", model=ScriptedLlm(model="scripted"), instruction="Be brief.", output_key="last")
    sessions, memory = MemqSessionService(memq), MemqMemoryService(memq, mode="keyword")
    runner = Runner(app_name=APP, agent=agent, session_service=sessions, memory_service=memory)
    session = await sessions.create_session(app_name=APP, user_id=user, state={"user:name": "Ann"})

    replies = await three_turns(runner, user, session.id)
    # Every turn the model saw the whole conversation so far, read back from memq.
    assert replies == ["[1] you said hello", "[3] you said pineapple pizza please", "[5] you said thanks"]

    stored = await sessions.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert [e.author for e in stored.events] == ["user", "echo"] * 3
    assert mine(stored.state, user) == {"user:name": "Ann", "last": "[5] you said thanks"}

    # Memory: the conversation is searchable (as the preload_memory tool would
    # ask), at once: the search waits until what this client wrote is indexed.
    await memory.add_session_to_memory(stored)
    found = await memory.search_memory(app_name=APP, user_id=user, query="pineapple pizza")
    assert "pineapple pizza please" in texts_of(found)
    assert all(m.custom_metadata["session_id"] == session.id for m in found.memories)


async def test_a_runners_turns_read_the_session_in_the_client(memq_url, user):
    """With local reads, a Runner's get_session after its own appends is
    answered in the client (no request), and the model sees what it would
    have seen read from the service."""
    local = LocalWindows()
    async with await MemoryClient.connect(memq_url, app=APP, local_reads=local) as client:
        agent = LlmAgent(name="echo", model=ScriptedLlm(model="scripted"), instruction="Be brief.", output_key="last")
        sessions = MemqSessionService(client, consistency="own")
        runner = Runner(app_name=APP, agent=agent, session_service=sessions)
        session = await sessions.create_session(app_name=APP, user_id=user, state={"user:name": "Ann"})
        replies = await three_turns(runner, user, session.id)
        assert replies == ["[1] you said hello", "[3] you said pineapple pizza please", "[5] you said thanks"]
        assert local.hits >= 2  # the second and third turns' reads
        held = await sessions.get_session(app_name=APP, user_id=user, session_id=session.id)
    async with await MemoryClient.connect(memq_url, app=APP) as reference:
        stored = await MemqSessionService(reference).get_session(app_name=APP, user_id=user, session_id=session.id)
    assert held.model_dump() == stored.model_dump()


async def test_memory_finds_what_was_just_added(memq, memq_url, user):
    """add_session_to_memory then search_memory, at once, 20 times: each
    search finds the session just added. Sessions of memq written by this
    client, by another client (the memory service waits for the session's
    newest event), and of another session service (copied in, then waited for)."""
    sessions, memory = MemqSessionService(memq), MemqMemoryService(memq)  # hybrid, as by default
    async with await MemoryClient.connect(memq_url, app=APP) as writer:
        elsewhere, other = MemqSessionService(writer), InMemorySessionService()
        for i in range(20):
            word = f"zq{uuid.uuid4().hex[:8]}"
            service = (sessions, elsewhere, other)[i % 3]
            session = await service.create_session(app_name=APP, user_id=user)
            await service.append_event(session, said("user", f"Remember the code word {word}."))
            await memory.add_session_to_memory(session)
            found = await memory.search_memory(app_name=APP, user_id=user, query=word)
            assert f"Remember the code word {word}." in texts_of(found), (i, type(service).__name__)


def texts_of(found) -> list[str]:
    return [m.content.parts[0].text for m in found.memories]


async def test_memory_takes_sessions_of_another_session_service_once(memq, user):
    other = InMemorySessionService()
    session = await other.create_session(app_name=APP, user_id=user, session_id="elsewhere")
    await other.append_event(session, said("user", "The boat is called Marigold."))
    await other.append_event(session, said("agent", "A fine name.", actions=EventActions(state_delta={"user:x": 1})))
    memory = MemqMemoryService(memq, mode="keyword")
    await memory.add_session_to_memory(session)
    await memory.add_session_to_memory(session)  # again: nothing twice
    found = await memory.search_memory(app_name=APP, user_id=user, query="Marigold boat")
    assert texts_of(found).count("The boat is called Marigold.") == 1
    hist = await memq.history(user, "elsewhere")
    assert len(hist.events) == 2
    assert mine(await memq.get_state(user), user) == {}  # content only: memory does not take the session's state

    # and an InMemoryMemoryService over the same session finds the same event (ADK's reference)
    reference = InMemoryMemoryService()
    await reference.add_session_to_memory(session)
    assert "The boat is called Marigold." in texts_of(
        await reference.search_memory(app_name=APP, user_id=user, query="Marigold boat")
    )
