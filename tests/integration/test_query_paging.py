"""Sessions of any size: session.get, history and context answer in pages
that fit NATS's max_payload, consistent across pages, and the client joins
them (issue 13, "Sessions of any size")."""

from __future__ import annotations

import dataclasses
from contextlib import asynccontextmanager

import nats
import orjson
import pytest
from helpers import make_settings, running_query, running_worker
from services import NatsServer, running

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import request_subject
from memq.workers.memory.tokens import event_messages

APP = "paging-app"
KB = "x" * 900  # with its envelope, an event of about 1 KB


def text(role: str, body: str) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=body)]))


def turns(n: int, start: int = 0) -> list[Event]:
    return [text("user" if i % 2 == 0 else "assistant", f"{i} {KB}") for i in range(start, start + n)]


@asynccontextmanager
async def stack(nats_url, db_url, tmp_path, reply_bytes: int | None = None):
    """Persistence and query workers, with no cache (each page is computed)
    and, when given, a smaller page than the server's max_payload allows."""
    settings = make_settings(nats_url, db_url, tmp_path)
    settings.cache = settings.cache.model_validate({**settings.cache.model_dump(), "backend": "none"})
    async with running_worker(settings), running_query(settings) as query:
        if reply_bytes is not None:
            query.ctx = dataclasses.replace(query.ctx, reply_bytes=reply_bytes)
        async with await MemoryClient.connect(nats_url, app=APP, timeout=30, wait_ms=30_000) as client:
            yield query, client


async def ask(nc, op: str, user: str = "u", **body) -> dict:
    request = {"v": 1, "app": APP, "user": user, **body}
    reply = await nc.request(request_subject(APP, op), orjson.dumps(request), timeout=30)
    return orjson.loads(reply.data)


async def test_a_20000_event_session_of_1kb_events_comes_back_whole(nats_url, pg_url, tmp_path):
    async with stack(nats_url, pg_url, tmp_path) as (_, client):
        events = turns(20_000)
        seqs = await client.append_many("u", "big", events)
        whole = await client.get_session("u", "big", events=True)
        assert [e.seq for e in whole.events] == seqs and not whole.truncated and whole.next_cursor is None
        assert [e.event["id"] for e in whole.events] == [e.id for e in events]
        history = await client.history("u", "big", strategy={"kind": "all"})
        assert [e.seq for e in history.events] == seqs and history.next_cursor is None
        assert history.tokens == sum(e.tokens for e in whole.events) and history.over_budget
        context = await client.context("u", "big", strategy={"kind": "all"}, format="openai")
        assert [m["content"] for m in context.messages] == [e.message.parts[0].text for e in events]
        assert context.over_budget and context.next_cursor is None


async def test_pages_join_into_the_unpaged_answer(nats_url, sqlite_url, tmp_path):
    """The same reads with 4 KiB pages and with one page: equal, field by field."""
    async with stack(nats_url, sqlite_url, tmp_path) as (query, client):
        await client.create_session("u", "s", state={"k": "v"})
        seqs = await client.append_many("u", "s", turns(120))
        reads = {
            "whole": lambda: client.get_session("u", "s", events=True),
            "after_seq": lambda: client.get_session("u", "s", after_seq=seqs[10]),
            "recent": lambda: client.get_session("u", "s", num_recent_events=50),
            "roles": lambda: client.get_session("u", "s", roles=["assistant"]),
            "all": lambda: client.history("u", "s", strategy={"kind": "all"}),
            "window": lambda: client.history("u", "s", strategy={"kind": "buffer_window", "window": 30}),
            "budget": lambda: client.history("u", "s", strategy={"kind": "token_window", "budget": 9000}),
            "filtered": lambda: client.history("u", "s", strategy={"kind": "all"}, roles=["user"]),
            "context": lambda: client.context("u", "s", strategy={"kind": "all"}, instruction="be {k}"),
            "openai": lambda: client.context("u", "s", strategy={"kind": "all"}, format="openai", message="next?"),
            "memq": lambda: client.context("u", "s", strategy={"kind": "all"}, message="next " + KB),
            "summary": lambda: client.context("u", "s", strategy={"budget": 9000}, model="gpt-4o"),
        }
        whole = {name: await read() for name, read in reads.items()}
        query.ctx = dataclasses.replace(query.ctx, reply_bytes=4096)
        for name, read in reads.items():
            assert await read() == whole[name], name
        # and the pages were many
        assert len(whole["whole"].events) == 120 and len(whole["context"].context["window"]) == 120
        assert whole["memq"].context["window"][-1]["seq"] == 0  # the pending message, last
        raw = (await ask(client.nc, "session.get", session="s", events=True))["result"]
        assert raw["next_cursor"] and 1 <= len(raw["events"]) < 5 and raw["truncated"] is False


async def test_events_appended_while_paging_neither_shift_nor_repeat_a_read(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path, reply_bytes=8192) as (_, client):
        events = turns(100)
        seqs = await client.append_many("u", "s", events)
        read: list[int] = []
        async for stored in client.iter_events("u", "s"):
            if not read:  # the first page is in: the session grows meanwhile
                later = turns(40, start=100)
                seqs += await client.append_many("u", "s", later)
            read.append(stored.seq)
        assert read == seqs[:100]
        events += later
        for op, body in (
            ("history", {"strategy": {"kind": "all"}}),
            ("context", {"strategy": {"kind": "all"}, "format": "openai"}),
        ):
            first = (await ask(client.nc, op, session="s", min_seq=seqs[-1], **body))["result"]
            extra = turns(10, start=len(events))
            more = await client.append_many("u", "s", extra)
            pages, cursor = [first], first["next_cursor"]
            while cursor:
                pages.append((await ask(client.nc, op, session="s", cursor=cursor, min_seq=more[-1], **body))["result"])
                cursor = pages[-1]["next_cursor"]
            assert len(pages) > 2, op
            if op == "history":
                assert [e["seq"] for p in pages for e in p["events"]] == seqs
            else:
                texts = [m["content"] for p in pages for m in p["messages"]]
                assert texts == [e.message.parts[0].text for e in events]
            seqs += more
            events += extra


async def test_a_bad_or_foreign_cursor_is_an_invalid_request(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path, reply_bytes=4096) as (_, client):
        await client.append_many("u", "s", turns(20))
        await client.append_many("u", "other", turns(20))
        last = (await client.append_many("v", "s", turns(20)))[-1]
        cursor = (await ask(client.nc, "session.get", session="s", events=True, min_seq=last))["result"]["next_cursor"]
        assert cursor
        cases = {
            "garbage": ask(client.nc, "session.get", session="s", events=True, cursor="not a cursor"),
            "empty json": ask(client.nc, "session.get", session="s", events=True, cursor="W10="),
            "another session": ask(client.nc, "session.get", session="other", events=True, cursor=cursor),
            "another user": ask(client.nc, "session.get", user="v", session="s", events=True, cursor=cursor),
            "another op": ask(client.nc, "history", session="s", strategy={"kind": "all"}, cursor=cursor),
            "another filter": ask(client.nc, "session.get", session="s", roles=["user"], cursor=cursor),
        }
        for name, reply in cases.items():
            error = (await reply)["error"]
            assert error["code"] == "invalid_request" and "cursor" in error["message"], name
        # the right request with it reads on
        page = await ask(client.nc, "session.get", session="s", events=True, cursor=cursor)
        assert page["ok"] and page["result"]["events"]


@pytest.fixture
def small_nats():
    with running(lambda: NatsServer(config="max_payload: 16384")) as server:
        yield server


async def test_pages_fit_a_smaller_max_payload(small_nats, sqlite_url, tmp_path):
    async with stack(small_nats.url, sqlite_url, tmp_path) as (query, client):
        assert query.ctx.reply_bytes < 16384
        events = turns(200)
        seqs = await client.append_many("u", "s", events)
        assert [e.seq for e in (await client.get_session("u", "s", events=True)).events] == seqs
        assert [e.seq for e in (await client.history("u", "s", strategy={"kind": "all"})).events] == seqs
        context = await client.context("u", "s", strategy={"kind": "all"})
        assert [w["seq"] for w in context.context["window"]] == seqs
        assert context.messages == [m for e in events for m in event_messages(e.model_dump(mode="json"))]
        nc = await nats.connect(small_nats.url)
        try:
            raw = await ask(nc, "context", session="s", strategy={"kind": "all"})
            assert raw["ok"] and raw["result"]["next_cursor"]
        finally:
            await nc.close()
