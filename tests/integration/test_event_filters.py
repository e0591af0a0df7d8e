"""``session.get`` and ``history`` filtered by time (``after``) and by role
(``roles``): through the real persistence and query workers, on every SQL
dialect, on the wire, through the client and through `memq`."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import nats
import orjson
import pytest
from helpers import NoticesHandled, make_settings, run_memq, running_query, running_worker
from sqlalchemy import inspect as sa_inspect

from memq.contracts.client import MemoryClient
from memq.contracts.errors import InvalidRequest
from memq.contracts.schemas import Event, Message, TextPart, ToolCallPart, ToolResultPart
from memq.contracts.subjects import request_subject

APP = "filters"
USER = "u"
SESSION = "s"
NOW = time.time()
DAY = 86400.0


def said(role: str, text: str, age_s: float) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=text)]), timestamp=NOW - age_s)


# Three days of a conversation, oldest first; the last day has a tool unit.
CONVERSATION = [
    said("user", "three days ago", 3 * DAY),
    said("assistant", "answer three days ago", 3 * DAY - 60),
    said("user", "two hours ago", 7200),
    Event(
        author="assistant",
        message=Message(role="assistant", parts=[ToolCallPart(id="c1", name="weather", args={})]),
        timestamp=NOW - 7100,
    ),
    Event(
        author="tool",
        message=Message(role="tool", parts=[ToolResultPart(id="c1", name="weather", result="sun")]),
        timestamp=NOW - 7090,
    ),
    said("assistant", "sunny, two hours ago", 7000),
    said("user", "ten minutes ago", 600),
    said("assistant", "answer ten minutes ago", 590),
]


def texts(events) -> list[str]:
    """The ids of stored events, in order."""
    return [e.event["id"] for e in events]


IDS = [e.id for e in CONVERSATION]


def ids(*indexes: int) -> list[str]:
    return [IDS[i] for i in indexes]


async def publish(client: MemoryClient) -> list[int]:
    ref = await client.create_session(USER, SESSION)
    return [ref.seq, *await client.append_many(USER, SESSION, CONVERSATION)]


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_session_and_history_filtered_by_time_and_role(request, db, nats_url, tmp_path):
    url = request.getfixturevalue(db)
    settings = make_settings(nats_url, url, tmp_path)
    async with running_worker(settings) as worker, running_query(settings):
        # The migration made the (session, timestamp) index on this dialect.
        async with worker.live.engine.connect() as conn:
            indexes = await conn.run_sync(lambda c: sa_inspect(c).get_indexes("memq_events"))
        assert ["session_key", "timestamp"] in [i["column_names"] for i in indexes]

        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await publish(client)

            # after: unix seconds, a datetime, or a timedelta ("the last 24 hours").
            day = await client.get_session(USER, SESSION, after=NOW - DAY)
            assert texts(day.events) == ids(2, 3, 4, 5, 6, 7)
            assert texts(
                (await client.get_session(USER, SESSION, after=datetime.fromtimestamp(NOW - 3600))).events
            ) == ids(6, 7)
            assert texts((await client.get_session(USER, SESSION, after=timedelta(hours=24))).events) == ids(
                2, 3, 4, 5, 6, 7
            )
            # after is strict: an event exactly at the bound is left out.
            assert texts((await client.get_session(USER, SESSION, after=CONVERSATION[6].timestamp)).events) == ids(7)

            users = await client.get_session(USER, SESSION, roles=["user"])
            assert texts(users.events) == ids(0, 2, 6)
            both = await client.get_session(USER, SESSION, after=timedelta(days=1), roles=["user", "tool"])
            assert texts(both.events) == ids(2, 4, 6)
            # num_recent_events counts the events that pass the filters.
            recent = await client.get_session(USER, SESSION, roles=["assistant"], num_recent_events=2)
            assert texts(recent.events) == ids(5, 7)
            assert (await client.get_session(USER, SESSION, after=NOW + 60)).events == []

            # history: filters first, then the strategy windows what they kept.
            everything = await client.history(USER, SESSION, strategy={"kind": "all"}, after=timedelta(days=1))
            assert texts(everything.events) == ids(2, 3, 4, 5, 6, 7)
            assert everything.tokens == sum(e.tokens for e in everything.events)
            window = await client.history(
                USER, SESSION, strategy={"kind": "buffer_window", "window": 2}, roles=["user"]
            )
            assert texts(window.events) == ids(2, 6)
            turns = await client.history(
                USER,
                SESSION,
                strategy={"kind": "buffer_window", "turns": 1},
                after=NOW - DAY,
                roles=["user", "assistant"],
            )
            assert texts(turns.events) == ids(6, 7)
            # A role filter is exact: the tool call stays without its result.
            calls = await client.history(USER, SESSION, strategy={"kind": "all"}, roles=["assistant"], after=NOW - DAY)
            assert texts(calls.events) == ids(3, 5, 7)
            # With both roles, a window that would split the unit keeps it whole.
            unit = await client.history(
                USER,
                SESSION,
                strategy={"kind": "buffer_window", "window": 3},
                roles=["assistant", "tool"],
                after=NOW - DAY,
            )
            assert texts(unit.events) == ids(3, 4, 5, 7)
            budget = await client.history(
                USER, SESSION, strategy={"kind": "token_window", "budget": 10_000}, after=NOW - 3600
            )
            assert texts(budget.events) == ids(6, 7) and not budget.needs_summary

            with pytest.raises(InvalidRequest):
                await client.history(USER, SESSION, roles=["robot"])  # type: ignore[list-item]


async def test_filters_are_part_of_the_cache_key_and_the_wire_format(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings) as query:
        notices = NoticesHandled(query)
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await notices.wait(await publish(client))  # committed, and no notice left to drop a cached answer
        nc = await nats.connect(nats_url)
        try:

            async def ask(op: str, **body) -> list[str]:
                request = {"v": 1, "app": APP, "user": USER, "session": SESSION, **body}
                reply = orjson.loads(
                    (await nc.request(request_subject(APP, op), orjson.dumps(request), timeout=10)).data
                )
                assert reply["ok"], reply
                return [e["event"]["id"] for e in reply["result"]["events"]]

            all_kind = {"kind": "all"}
            # Each answer twice (the second from the cache), alternating filters
            # on one session: a key without the filters would mix them up.
            for _ in range(2):
                assert await ask("history", strategy=all_kind) == IDS
                assert await ask("history", strategy=all_kind, roles=["user"]) == ids(0, 2, 6)
                assert await ask("history", strategy=all_kind, roles=["assistant"]) == ids(1, 3, 5, 7)
                assert await ask("history", strategy=all_kind, after=NOW - 3600) == ids(6, 7)
                assert await ask("history", strategy=all_kind, after=NOW - DAY) == ids(2, 3, 4, 5, 6, 7)
                assert await ask("session.get", after=NOW - 3600) == ids(6, 7)
                assert await ask("session.get", events=True) == IDS
                assert await ask("session.get", roles=["tool"]) == ids(4)
            assert query.live.cache.hits >= 8
            bad = {"v": 1, "app": APP, "user": USER, "session": SESSION, "after": "yesterday"}
            reply = orjson.loads(
                (await nc.request(request_subject(APP, "history"), orjson.dumps(bad), timeout=10)).data
            )
            assert reply["error"]["code"] == "invalid_request"
        finally:
            await nc.close()


async def test_cli_after_and_role(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await publish(client)
            await client.get_session(USER, SESSION)  # committed
        read = ("-a", APP, "-u", USER, SESSION)

        shown = await run_memq(settings, "sessions", "show", *read, "--after", "24h", "--role", "user")
        assert shown.returncode == 0, shown.stderr
        assert "two hours ago" in shown.stdout and "ten minutes ago" in shown.stdout
        assert "three days ago" not in shown.stdout and "sunny" not in shown.stdout

        history = await run_memq(
            settings, "history", *read, "--strategy", "all", "--after", "30m", "--role", "assistant"
        )
        assert history.returncode == 0, history.stderr
        assert "answer ten minutes ago" in history.stdout
        assert history.stdout.count("ten minutes ago") == 1 and "sunny" not in history.stdout

        iso = datetime.fromtimestamp(NOW - 2 * DAY).isoformat(timespec="seconds")
        since = await run_memq(settings, "history", *read, "--strategy", "all", "--after", iso, "--role", "tool")
        assert since.returncode == 0, since.stderr
        assert "weather" in since.stdout and "three days ago" not in since.stdout and "sunny" not in since.stdout

        week = await run_memq(settings, "history", *read, "--strategy", "all", "--after", "7d")
        assert "three days ago" in week.stdout

        bad = await run_memq(settings, "history", *read, "--after", "yesterday")
        assert bad.returncode == 2 and "24h" in bad.stderr


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_times_keep_double_precision_on_every_dialect(request, db):
    """MySQL's FLOAT is single precision (a time today rounds to 128 s):
    migration 0004 makes the time columns DOUBLE there and restores event
    times from the events' JSON."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import insert, select

    from memq.workers.sql import models
    from memq.workers.sql.engine import MIGRATIONS_DIR, create_engine, migrate

    events = models.Event.__table__

    def upgrade_to(revision: str):
        def run(sync_conn):
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
            cfg.attributes["connection"] = sync_conn
            command.upgrade(cfg, revision)

        return run

    def row(event_id: str, seq: int, ts: float) -> dict:
        data = orjson.dumps({"id": event_id, "timestamp": ts}).decode()
        return dict(
            session_key="a" * 64,
            event_id=event_id,
            seq=seq,
            invocation_id="",
            author="user",
            branch="",
            role="user",
            timestamp=ts,
            tokens=1,
            data=data,
        )

    engine = create_engine(request.getfixturevalue(db))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(upgrade_to("0003"))
            await conn.execute(insert(events), [row("old", 1, 1_763_900_000.123)])
        await migrate(engine)
        async with engine.begin() as conn:
            await conn.execute(insert(events), [row("new", 2, 1_763_900_000.456)])
            stored = dict((await conn.execute(select(events.c.event_id, events.c.timestamp))).all())
        assert stored == {"old": 1_763_900_000.123, "new": 1_763_900_000.456}
    finally:
        await engine.dispose()
