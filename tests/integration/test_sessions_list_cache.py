"""sessions.list through the query worker's cache: a repeated page is a hit,
and a commit or a delete of any session in the page's scope (the user's, or
the app's) makes the next page fresh."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import nats
import orjson
from helpers import make_settings, running_query, running_worker

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import request_subject

APP = "list-cache"


def text(body: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=body)]))


async def page(nc, user: str | None, min_seq: int | None = None) -> list[tuple[str, str, int]]:
    request = {"v": 1, "app": APP, "user": user, "limit": 50}
    if min_seq is not None:
        request["min_seq"] = min_seq
    reply = orjson.loads((await nc.request(request_subject(APP, "sessions.list"), orjson.dumps(request))).data)
    assert reply["ok"], reply
    return [(s["user"], s["session"], s["last_seq"]) for s in reply["result"]["sessions"]]


async def until(nc, user: str | None, check: Callable[[list], bool], what: str) -> list:
    """Pages without min_seq until one passes ``check``: only the commit
    notice can make a cached page fresh here."""
    deadline = time.monotonic() + 10
    while not check(rows := await page(nc, user)):
        assert time.monotonic() < deadline, f"{what}: the cached page stayed stale ({rows})"
        await asyncio.sleep(0.05)
    return rows


async def test_a_repeated_page_is_a_hit_until_a_session_of_its_scope_changes(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings) as query:
        nc = await nats.connect(nats_url)
        try:
            async with await MemoryClient.connect(nats_url, app=APP) as client:
                await client.create_session("u", "s1")
                await client.create_session("u", "s2")
                last = (await client.create_session("w", "other")).seq
                first = await page(nc, "u", min_seq=last)
                everyone = await page(nc, None, min_seq=last)
                assert {s for _, s, _ in first} == {"s1", "s2"}
                assert len(everyone) == 3

                # Both pages answered from the cache. (The notices of the
                # commits above may still arrive and drop them once: ask again.)
                deadline = time.monotonic() + 10
                while True:
                    hits = query.live.cache.hits
                    assert await page(nc, "u") == first
                    assert await page(nc, None) == everyone
                    if query.live.cache.hits == hits + 2:
                        break
                    assert time.monotonic() < deadline, "a repeated page is never a cache hit"
                    await asyncio.sleep(0.05)

                # A commit to one of u's sessions: u's page and the app's show it.
                seq = await client.append("u", "s1", text("hello"))
                rows = await until(nc, "u", lambda r: ("u", "s1", seq) in r, "append to s1")
                assert rows[0] == ("u", "s1", seq)  # newest update first
                await until(nc, None, lambda r: ("u", "s1", seq) in r, "append to s1, the app's page")

                # Another user's commit leaves u's cached page as it is.
                again = await page(nc, "u")
                hits = query.live.cache.hits
                await client.append("w", "other", text("hi"))
                await until(nc, None, lambda r: r[0][:2] == ("w", "other"), "append to w's session")
                assert await page(nc, "u") == again
                assert query.live.cache.hits > hits

                # A deleted session leaves the page.
                await client.delete_session("u", "s2")
                await until(nc, "u", lambda r: [s for _, s, _ in r] == ["s1"], "delete s2")
                await until(nc, None, lambda r: ("u", "s2") not in [x[:2] for x in r], "delete s2, the app's page")
        finally:
            await nc.close()
