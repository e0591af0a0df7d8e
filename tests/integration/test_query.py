"""The query worker over real NATS, SQL and Redis: read-your-writes, the cache,
isolation between apps and users, and typed errors for bad requests."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import asynccontextmanager

import nats
import orjson
import pytest
from helpers import make_settings, running_query, running_worker, wait_for

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import CheckpointSaved, Event, Message, TextPart, ToolCallPart, ToolResultPart
from memq.contracts.subjects import request_subject
from memq.workers.memory.tokens import count_event

APP = "q-app"


@asynccontextmanager
async def stack(nats_url, db_url, tmp_path, **settings):
    s = make_settings(nats_url, db_url, tmp_path)
    for section, values in settings.items():
        current = getattr(s, section)
        setattr(s, section, type(current).model_validate({**current.model_dump(), **values}))
    async with running_worker(s), running_query(s) as query:
        nc = await nats.connect(nats_url)
        try:
            yield s, query, nc
        finally:
            await nc.close()


def text(role: str, body: str) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=body)]))


async def ask(nc, op: str, app: str = APP, timeout: float = 10, **body) -> dict:
    request = {"v": 1, "app": app, "user": "u", **body}
    reply = await nc.request(request_subject(app, op), orjson.dumps(request), timeout=timeout)
    return orjson.loads(reply.data)


async def test_read_your_writes_under_load(nats_url, pg_url, tmp_path):
    async with stack(nats_url, pg_url, tmp_path) as (_, _, nc):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            stop = asyncio.Event()

            async def flood() -> None:  # other sessions keep the worker busy
                i = 0
                while not stop.is_set():
                    await client.append_many("u", f"noise-{i % 7}", [text("user", "noise")] * 200)
                    i += 1

            async def writer(w: int) -> None:
                session = f"rw-{w}"
                for i in range(30):
                    event = text("user", f"writer {w} message {i}")
                    seq = await client.append("u", session, event)
                    reply = await ask(nc, "history", session=session, min_seq=seq, wait_ms=10_000)
                    assert reply["ok"], reply
                    assert reply["result"]["events"][-1]["event"]["id"] == event.id

            noise = asyncio.create_task(flood())
            try:
                await asyncio.gather(*(writer(w) for w in range(5)))
            finally:
                stop.set()
                await noise


async def test_min_seq_not_committed_is_a_typed_timeout(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_query(s), await MemoryClient.connect(nats_url, app=APP) as client:
        async with running_worker(s):  # the streams; then nothing commits
            await client.append("u", "s", text("user", "committed"))
        seq = await client.append("u", "s", text("user", "hi"))
        nc = client.nc
        started = time.monotonic()
        reply = await ask(nc, "history", session="s", min_seq=seq, wait_ms=300)
        assert reply["error"]["code"] == "not_committed"
        assert time.monotonic() - started < 3
        # A min_seq the stream never reached cannot be committed: refused at once, not after wait_ms.
        started = time.monotonic()
        reply = await ask(nc, "history", session="s", min_seq=seq + 1000, wait_ms=10_000)
        assert reply["error"]["code"] == "invalid_request"
        assert f"min_seq {seq + 1000} is beyond the events stream's last sequence {seq}" in reply["error"]["message"]
        assert time.monotonic() - started < 3


async def test_cache_never_serves_a_stale_read_and_survives_redis_dying(nats_url, pg_url, redis_server, tmp_path):
    async with stack(nats_url, pg_url, tmp_path, cache={"redis_url": redis_server.url}) as (_, query, nc):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seen: list[str] = []
            for i in range(40):
                event = text("user", f"m{i}")
                seq = await client.append("u", "s", event)
                seen.append(event.id)
                # Twice: the second is a cache hit, and must be as fresh.
                for _ in range(2):
                    reply = await ask(nc, "history", session="s", min_seq=seq)
                    assert [e["event"]["id"] for e in reply["result"]["events"]] == seen
                if i == 15:
                    redis_server.kill()
                if i == 30:
                    redis_server.restart()
            assert query.live.cache.hits > 0 and query.live.cache.errors > 0


async def test_cache_is_invalidated_by_commits_without_min_seq(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path) as (_, query, nc):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.create_session("u", "s", state={"k": 1})
            first = await ask(nc, "state.get", session="s", min_seq=seq.seq)
            assert first["result"]["state"] == {"k": 1}

            # The answer is cached now. (The floor may have passed seq on the
            # consumer's ack floor before the commit notice came: that notice
            # then drops the answer once. Ask again.)
            async def a_hit() -> bool:
                hits = query.live.cache.hits
                assert (await ask(nc, "state.get", session="s")) == first
                return query.live.cache.hits == hits + 1

            await wait_for(a_hit, 10, "a repeated state.get answered from the cache")
            await client.set_state("u", {"app:model": "m2"})  # app state: another scope
            deadline = time.monotonic() + 10
            while (await ask(nc, "state.get", session="s"))["result"]["state"] != {"k": 1, "app:model": "m2"}:
                assert time.monotonic() < deadline, "the commit notice never invalidated the cached state"
                await asyncio.sleep(0.05)


async def test_isolation_between_apps_and_users(nats_url, sqlite_url, tmp_path):
    async with stack(nats_url, sqlite_url, tmp_path) as (_, _, nc):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            ref = await client.create_session("victim", "secret-session", state={"secret": 42})
        # App A's session asked for through app B's subject.
        request = {"v": 1, "app": APP, "user": "victim", "session": "secret-session", "min_seq": ref.seq}
        reply = orjson.loads(
            (await nc.request(request_subject("other-app", "session.get"), orjson.dumps(request))).data
        )
        assert reply["error"]["code"] == "forbidden"
        # Another user who guessed the session id.
        reply = await ask(nc, "session.get", session="secret-session", min_seq=ref.seq)
        assert reply["error"]["code"] == "not_found"
        reply = await ask(nc, "sessions.list")
        assert reply["result"]["sessions"] == []
        # The owner sees it.
        reply = await ask(nc, "session.get", session="secret-session", min_seq=ref.seq, **{"user": "victim"})
        assert reply["result"]["state"] == {"secret": 42}


@pytest.mark.parametrize(
    ("subject_app", "payload", "code"),
    [
        (APP, b"{not json", "invalid_request"),
        (APP, b"[1, 2]", "invalid_request"),
        (APP, orjson.dumps({"v": 2, "app": APP, "user": "u", "session": "s"}), "invalid_request"),
        (APP, orjson.dumps({"v": 1, "app": APP, "user": "u", "session": "s", "bogus": 1}), "invalid_request"),
        (APP, orjson.dumps({"v": 1, "app": APP, "user": "u" * 300, "session": "s"}), "invalid_id"),
        (
            APP,
            orjson.dumps({"v": 1, "app": APP, "user": "u", "session": "s", "strategy": {"kind": "magic"}}),
            "invalid_request",
        ),
        (
            APP,
            orjson.dumps({"v": 1, "app": APP, "user": "u", "session": "s", "strategy": {"window": -1}}),
            "invalid_request",
        ),
        (APP, orjson.dumps({"v": 1, "app": APP, "user": "u", "session": "s", "min_seq": "soon"}), "invalid_request"),
        ("bad~ZZapp", orjson.dumps({"v": 1, "app": APP, "user": "u", "session": "s"}), "invalid_id"),
    ],
)
async def test_bad_requests_get_typed_errors_not_hangs(nats_url, sqlite_url, tmp_path, subject_app, payload, code):
    async with stack(nats_url, sqlite_url, tmp_path) as (_, _, nc):
        subject = f"memq.v1.q.{subject_app}.history"
        reply = orjson.loads((await nc.request(subject, payload, timeout=5)).data)
        assert reply["ok"] is False and reply["error"]["code"] == code, reply
        bad_cursor = {"v": 1, "app": APP, "user": "u", "cursor": "not-a-cursor"}
        reply = orjson.loads((await nc.request(request_subject(APP, "sessions.list"), orjson.dumps(bad_cursor))).data)
        assert reply["error"]["code"] == "invalid_request"


async def test_history_counts_exactly_and_summary_buffer_keeps_everything_after_the_checkpoint(
    nats_url, sqlite_url, tmp_path
):
    events = [text("user" if i % 2 == 0 else "assistant", f"turn {i}: " + "word " * i) for i in range(12)]
    call = Event(
        author="assistant", message=Message(role="assistant", parts=[ToolCallPart(id="c1", name="f", args={"x": 1})])
    )
    result = Event(
        author="tool", message=Message(role="tool", parts=[ToolResultPart(id="c1", name="f", result={"y": 2})])
    )
    events += [call, result, text("assistant", "done")]
    async with stack(nats_url, sqlite_url, tmp_path) as (_, _, nc):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seqs = await client.append_many("u", "s", events)
            reply = await ask(nc, "history", session="s", min_seq=seqs[-1], strategy={"kind": "all"})
            got = reply["result"]["events"]
            assert [e["tokens"] for e in got] == [
                count_event(e.model_dump(mode="json", exclude_none=True)) for e in events
            ]
            assert reply["result"]["tokens"] == sum(e["tokens"] for e in got)

            # A summary of the first 10 events; Hector's summary_buffer would
            # keep only the summary here, ours keeps every later event.
            nc_js = nc.jetstream()
            checkpoint = CheckpointSaved(
                app=APP, user="u", session="s", summary="They counted words.", up_to_seq=seqs[9]
            )
            from memq.contracts import codec

            ack = await nc_js.publish(codec.subject_for(checkpoint), codec.encode(checkpoint))
            reply = await ask(nc, "history", session="s", min_seq=ack.seq, strategy={"kind": "summary_buffer"})
            r = reply["result"]
            assert r["summary"] == "They counted words." and r["checkpoint_seq"] == seqs[9]
            assert [e["seq"] for e in r["events"]] == seqs[10:]

            # The last two messages are the tool result and "done": a window of
            # 2 would cut the result from its call, so both go or both stay.
            reply = await ask(nc, "history", session="s", strategy={"kind": "buffer_window", "window": 2})
            assert [e["seq"] for e in reply["result"]["events"]] in (seqs[-3:], seqs[-1:])


async def test_context_fits_its_budget_by_default_and_all_says_when_it_is_over(nats_url, sqlite_url, tmp_path):
    events = [text("user" if i % 2 == 0 else "assistant", f"turn {i}: " + "word " * 20) for i in range(30)]
    call = Event(
        author="assistant", message=Message(role="assistant", parts=[ToolCallPart(id="c1", name="f", args={"x": 1})])
    )
    result = Event(
        author="tool", message=Message(role="tool", parts=[ToolResultPart(id="c1", name="f", result={"y": 2})])
    )
    events += [call, result, text("assistant", "done")]
    async with stack(nats_url, sqlite_url, tmp_path) as (_, _, nc):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many("u", "s", events)
            assert sum(count_event(e.model_dump(mode="json", exclude_none=True)) for e in events) > 5 * 120
            for fmt in ("openai", "memq"):
                # no summary exists yet: the default strategy drops the oldest
                fits = await client.context("u", "s", strategy={"budget": 120}, format=fmt)
                assert fits.tokens["total"] <= 120 and (fits.budget, fits.over_budget, fits.note) == (120, False, None)
                assert fits.messages[-1] == {"role": "assistant", "content": "done"}
                over = await client.context("u", "s", strategy={"kind": "none", "budget": 120}, format=fmt)
                assert over.tokens["total"] > 120 and over.budget == 120 and over.over_budget
                assert f"{over.tokens['total']} tokens for a budget of 120 (strategy all" in over.note
            # on the wire, an OpenAI-format reply carries it beside the messages
            reply = (await ask(nc, "context", session="s", format="openai", strategy={"kind": "all", "budget": 120}))[
                "result"
            ]
            assert reply["over_budget"] is True and reply["budget"] == 120 and reply["note"].startswith("over budget")
            assert reply["context"] is None

            history = await client.history("u", "s", strategy={"budget": 120})
            assert history.strategy["kind"] == "summary_buffer" and history.tokens <= 120 and not history.over_budget
            history = await client.history("u", "s", strategy={"kind": "none", "budget": 120})
            assert history.strategy["kind"] == "all" and len(history.events) == len(events) and history.over_budget


async def test_a_whole_read_is_never_cut(nats_url, sqlite_url, tmp_path):
    # Pages of ~1.5 KB rather than writing 10,000 events (test_query_paging has the 20,000).
    async with stack(nats_url, sqlite_url, tmp_path) as (_, query, nc):
        query.ctx = dataclasses.replace(query.ctx, reply_bytes=1500)
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seqs = await client.append_many("u", "s", [text("user", f"m{i} " + "x" * 200) for i in range(6)])
            whole = await client.get_session("u", "s", events=True)
            assert [e.seq for e in whole.events] == seqs and not whole.truncated and whole.events_total is None
            rest = await client.get_session("u", "s", after_seq=seqs[3])
            assert [e.seq for e in rest.events] == seqs[4:] and not rest.truncated
            recent = await client.get_session("u", "s", num_recent_events=5)
            assert [e.seq for e in recent.events] == seqs[1:] and not recent.truncated
            raw = (await ask(nc, "session.get", session="s", events=True))["result"]
            assert 1 <= len(raw["events"]) < 6 and raw["next_cursor"]
            assert (raw["truncated"], raw["events_total"]) == (False, None)  # deprecated, kept for old readers
