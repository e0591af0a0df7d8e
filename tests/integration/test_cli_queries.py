"""Reading sessions back, as an agent and as a user: MemoryClient's reads
against a real persistence worker and query worker (in this process, on real
NATS and SQLite), then `memq sessions|history|context|forget|status` as subprocesses."""

from __future__ import annotations

import json
import os
import re

import pytest
from helpers import make_settings, run_memq, running_query, running_worker

from memq.contracts.client import MemoryClient
from memq.contracts.errors import InvalidId, NotFound
from memq.contracts.schemas import Actions, Event, Message, TextPart, ToolCallPart, ToolResultPart
from memq.workers.memory.tokens import count_event

APP = "cli.app"  # a dot: subjects carry the encoded token
USER = "ada@example.com"
SESSION = "trip to Lyon"


@pytest.fixture
async def stack(nats_url, sqlite_url, tmp_path):
    """(settings, client): a persistence and a query worker on SQLite, and a client."""
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            yield settings, client


def said(role: str, text: str, **actions) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=text)]), actions=Actions(**actions))


CONVERSATION = [
    said("user", "I want to visit Lyon in May.", state_delta={"city": "Lyon", "user:language": "French"}),
    said("assistant", "Lyon in May is lovely. Shall I look for trains?"),
    said("user", "Yes, from Paris."),
    Event(
        author="assistant",
        message=Message(role="assistant", parts=[ToolCallPart(id="c1", name="trains", args={"from": "Paris"})]),
    ),
    Event(author="tool", message=Message(role="tool", parts=[ToolResultPart(id="c1", name="trains", result=["8:04"])])),
    said("assistant", "There is a train at 8:04."),
]


async def publish_conversation(client: MemoryClient) -> list[int]:
    await client.create_session(USER, SESSION, state={"app:brand": "memq"})
    return await client.append_many(USER, SESSION, CONVERSATION)


async def test_client_reads_a_conversation_back(stack):
    _, client = stack
    seqs = await publish_conversation(client)

    # Read-your-writes by default: no waiting or polling before the first read.
    view = await client.get_session(USER, SESSION, events=True)
    assert [e.seq for e in view.events] == seqs
    assert [e.event["id"] for e in view.events] == [e.id for e in CONVERSATION]
    assert [e.tokens for e in view.events] == [count_event(e.model_dump(mode="json")) for e in CONVERSATION]
    assert view.state == {"city": "Lyon", "user:language": "French", "app:brand": "memq"}
    assert view.last_seq == seqs[-1]
    recent = await client.get_session(USER, SESSION, num_recent_events=2)
    assert [e.seq for e in recent.events] == seqs[-2:]
    assert await client.get_state(USER) == {"user:language": "French", "app:brand": "memq"}

    everything = await client.history(USER, SESSION, strategy={"kind": "all"})
    assert [e.seq for e in everything.events] == seqs
    assert everything.tokens >= sum(e.tokens for e in view.events)
    # Two messages would split the tool call from its result: the window keeps both or neither.
    window = await client.history(USER, SESSION, strategy={"kind": "buffer_window", "window": 2})
    assert [e.seq for e in window.events] in ([seqs[-1]], seqs[-3:])

    ctx = await client.context(USER, SESSION, format="openai", instruction="Answer in {user:language}. {mood?}")
    assert ctx.messages[0] == {"role": "system", "content": "Answer in French. "}
    assert ctx.messages[-1] == {"role": "assistant", "content": "There is a train at 8:04."}
    assert any(m.get("tool_calls") for m in ctx.messages) and any(m["role"] == "tool" for m in ctx.messages)
    assert ctx.tokens["total"] >= ctx.tokens["instruction"] + ctx.tokens["window"] > 0
    assert ctx.context is None
    assert (await client.context(USER, SESSION)).context["window"]  # memq format: per-part details

    with pytest.raises(NotFound):
        await client.get_session(USER, "no such session")
    with pytest.raises(NotFound):  # another user cannot read it, even knowing its id
        await client.history("mallory", SESSION)
    with pytest.raises(InvalidId):
        await client.history(USER, "")


async def test_artifacts_inline_and_in_the_object_store(stack):
    _, client = stack
    await client.create_session(USER, SESSION)
    small, large = b"a small note", os.urandom(600 * 1024)  # over the 256 KiB inline limit
    await client.save_artifact(USER, SESSION, "notes.txt", small, "text/plain")
    await client.save_artifact(USER, SESSION, "notes.txt", large)
    listed = await client.list_artifacts(USER, SESSION)
    assert [(a.filename, a.versions, a.size) for a in listed.artifacts] == [("notes.txt", 2, len(large))]
    assert await client.get_artifact(USER, SESSION, "notes.txt") == large
    assert await client.get_artifact(USER, SESSION, "notes.txt", version=0) == small
    with pytest.raises(NotFound):
        await client.get_artifact(USER, SESSION, "notes.txt", version=2)


async def test_with_history_remembers_the_conversation(stack):
    _, client = stack
    await client.create_session(USER, SESSION)
    calls: list[list[dict]] = []

    async def model(messages: list[dict]) -> str:
        calls.append(messages)
        return f"you said {len(messages)} things"

    chat = client.with_history(model, user=USER, session=SESSION, instruction="Be brief.")
    assert await chat("hello") == "you said 2 things"
    assert await chat("again") == "you said 4 things"
    assert calls[-1] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "you said 2 things"},
        {"role": "user", "content": "again"},
    ]
    history = await client.history(USER, SESSION, strategy={"kind": "all"})
    assert [e.event["message"]["role"] for e in history.events] == ["user", "assistant"] * 2


async def test_sessions_page_newest_update_first_without_gaps(stack):
    _, client = stack
    for i in range(250):
        await client.create_session(f"user-{i % 3}", f"s{i:03}")
    await client.append_text("user-1", "s010", "user", "back to an old one")  # now the newest update

    for page_size in (100, 7):
        found = [s async for s in client.iter_sessions(page_size=page_size)]
        assert len(found) == 250 and len({(s.user, s.session) for s in found}) == 250
        assert found[0].session == "s010"
        assert [s.updated_at for s in found] == sorted((s.updated_at for s in found), reverse=True)
    mine = [s async for s in client.iter_sessions("user-1", page_size=50)]
    assert {s.session for s in mine} == {f"s{i:03}" for i in range(250) if i % 3 == 1}
    first = await client.list_sessions(limit=100)
    second = await client.list_sessions(limit=100, cursor=first.next_cursor)
    assert first.next_cursor and not {s.session for s in first.sessions} & {s.session for s in second.sessions}


# --- the commands ---------------------------------------------------------------


async def test_commands_show_sessions_history_context_and_status(stack):
    settings, client = stack
    await publish_conversation(client)
    await client.get_session(USER, SESSION)  # committed

    listed = await run_memq(settings, "sessions", "list", "--app", APP)
    assert listed.returncode == 0, listed.stderr
    assert SESSION in listed.stdout and USER in listed.stdout and "1 session" in listed.stdout

    shown = await run_memq(settings, "sessions", "show", "--app", APP, "--user", USER, SESSION, "--events", "2")
    assert shown.returncode == 0, shown.stderr
    assert '"user:language": "French"' in shown.stdout and "There is a train at 8:04." in shown.stdout

    history = await run_memq(settings, "history", "-a", APP, "-u", USER, SESSION, "--strategy", "all")
    assert history.returncode == 0, history.stderr
    assert "Lyon in May is lovely" in history.stdout and '→ trains({"from": "Paris"})' in history.stdout
    read = ("-a", APP, "-u", USER, SESSION)
    window = await run_memq(settings, "history", *read, "--strategy", "buffer_window", "--window", "1")
    assert "I want to visit Lyon" not in window.stdout and "8:04." in window.stdout

    context = await run_memq(
        settings, "context", *read, "--format", "openai", "--instruction", "Speak {user:language}."
    )
    assert context.returncode == 0, context.stderr
    for expected in ("instruction", "window", "total", "Speak French.", "tool_call_id"):
        assert expected in context.stdout, context.stdout
    missing = await run_memq(settings, "context", "-a", APP, "-u", USER, SESSION, "--instruction", "{nope}")
    assert missing.returncode == 1 and "template_key_missing" in missing.stderr

    status = await run_memq(settings, "status")
    assert status.returncode == 0, status.stderr
    assert "memq-persistence" in status.stdout  # the consumer; the instances by kind:
    assert any(line.split()[:1] == ["query"] for line in status.stdout.splitlines()), status.stdout
    report = json.loads((await run_memq(settings, "status", "--json")).stdout)
    assert [(c["name"], c["pending"], c["ack_floor"]) for c in report["consumers"]] == [
        ("memq-persistence", 0, report["last_seq"])
    ]
    instances = {i["name"]: i for i in report["instances"]}
    assert sorted(instances) == ["memq-persistence", "memq-query"]
    assert instances["memq-query"]["requests"] >= 4 and report["dlq_messages"] == 0

    refused = await run_memq(settings, "sessions", "delete", "-a", APP, "-u", USER, SESSION, input="n\n")
    assert refused.returncode == 1 and "Aborted" in refused.stderr
    deleted = await run_memq(settings, "sessions", "delete", "-a", APP, "-u", USER, SESSION, "--yes")
    assert deleted.returncode == 0, deleted.stderr
    delete_seq = int(re.search(r"delete published at seq (\d+)", deleted.stdout)[1])
    with pytest.raises(NotFound):  # the delete came from another process: wait for it by its seq
        await client.get_session(USER, SESSION, min_seq=delete_seq)
    gone = await run_memq(settings, "history", "-a", APP, "-u", USER, SESSION)
    assert gone.returncode == 1 and "not_found" in gone.stderr


async def test_forget_and_the_options_taken_from_the_requests(stack):
    settings, client = stack
    seqs = await publish_conversation(client)
    read = ("-a", APP, "-u", USER, SESSION)
    # --min-seq waits for the write, --after-seq picks events after one
    shown = await run_memq(
        settings, "sessions", "show", *read, "--after-seq", str(seqs[-2]), "--min-seq", str(seqs[-1])
    )
    assert shown.returncode == 0, shown.stderr
    assert "There is a train at 8:04." in shown.stdout and "Yes, from Paris." not in shown.stdout
    asked = await run_memq(
        settings, "context", *read, "--format", "openai", "--message", "Which platform?", "--recall-limit", "0"
    )
    assert asked.returncode == 0, asked.stderr
    assert "Which platform?" in asked.stdout

    refused = await run_memq(settings, "forget", *read, str(seqs[0]), input="n\n")
    assert refused.returncode == 1 and "Aborted" in refused.stderr
    forgot = await run_memq(settings, "forget", *read, str(seqs[0]), "--yes")
    assert forgot.returncode == 0, forgot.stderr
    forget_seq = int(re.search(r"forget published at seq (\d+)", forgot.stdout)[1])
    view = await client.get_session(USER, SESSION, events=True, min_seq=forget_seq)
    assert [e.seq for e in view.events or ()] == seqs[1:]

    again = await run_memq(settings, "forget", *read, str(seqs[0]), "--yes")
    assert again.returncode == 1 and "nothing forgotten" in again.stderr
    # another app names the same user and session: nothing of this app's is forgotten
    other = await run_memq(settings, "forget", "-a", "other.app", "-u", USER, SESSION, str(seqs[1]), "--yes")
    assert other.returncode == 1 and "not_found" in other.stderr
    assert [e.seq for e in (await client.get_session(USER, SESSION, events=True)).events or ()] == seqs[1:]


async def test_context_and_history_commands_say_when_over_budget(stack):
    settings, client = stack
    await publish_conversation(client)
    read = ("-a", APP, "-u", USER, SESSION)
    everything = await client.context(USER, SESSION, strategy={"kind": "all"})
    budget = everything.tokens["total"] // 2

    fits = await run_memq(
        settings, "context", *read, "--budget", str(budget), "--format", "openai"
    )  # the default strategy
    assert fits.returncode == 0, fits.stderr
    assert f"within the budget of {budget}" in fits.stdout and "over budget" not in fits.stdout
    for kind in ("none", "all"):
        over = await run_memq(
            settings, "context", *read, "--strategy", kind, "--budget", str(budget), "--format", "openai"
        )
        assert over.returncode == 0, over.stderr
        assert f"over budget: {everything.tokens['total']} tokens for a budget of {budget}" in over.stdout, over.stdout
    window = await run_memq(settings, "context", *read, "--strategy", "buffer_window", "--format", "memq")
    assert "strategy buffer_window" in window.stdout and "within the budget of 8000" in window.stdout

    history = await run_memq(settings, "history", *read, "--strategy", "none", "--budget", str(budget))
    assert history.returncode == 0, history.stderr
    assert "strategy all" in history.stdout and f"over the budget of {budget}" in history.stdout


async def test_commands_without_a_query_service_say_what_to_run(nats_url, tmp_path):
    settings = make_settings(nats_url, f"sqlite+aiosqlite:///{tmp_path}/memq.db", tmp_path)
    out = await run_memq(settings, "sessions", "list")
    assert out.returncode == 1
    assert "no query service is answering" in out.stderr and "memq up" in out.stderr
