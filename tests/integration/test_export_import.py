"""`memq export` / `memq import` between two real deployments (issue 15): a
PostgreSQL deployment exported to JSON Lines and imported into a SQLite one
on another NATS server yields the same sessions, state and history; a second
import changes nothing; bad lines are reported by number, nothing imported."""

from __future__ import annotations

from typing import Any

import nats
import orjson
import pytest
from helpers import make_settings, run_memq, running_worker, wait_committed
from services import NatsServer, running
from sqlalchemy import select

from memq.contracts import codec
from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Actions, CheckpointSaved, Event, Message, TextPart
from memq.workers.sql import models
from memq.workers.sql.engine import create_engine

APP = "export-app"
OTHER = "other-app"


@pytest.fixture
def target_nats():
    with running(NatsServer) as server:
        yield server


def turn(text: str, role: str = "user", **delta: Any) -> Event:
    return Event(
        author="user" if role == "user" else "agent",
        message=Message(role=role, parts=[TextPart(text=text)]),  # type: ignore[arg-type]
        actions=Actions(state_delta=delta),
    )


async def stream_last_seq(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info("MEMQ_EVENTS")).state.last_seq
    finally:
        await nc.close()


async def populate(url: str) -> None:
    """Two apps, users, state of every scope (a key set then deleted), an
    artifact, a checkpoint and a deleted session, all committed."""
    async with await MemoryClient.connect(url, app=APP) as client:
        await client.create_session("alice", "s1", state={"topic": "trips", "user:lang": "fr"})
        seqs = await client.append_many(
            "alice",
            "s1",
            [
                turn("I want to go to Lisbon", mood="happy", **{"user:city": "Porto", "app:version": 1}),
                turn("Lisbon is lovely in May", role="assistant"),
                turn("Book it", **{"temp:scratch": 1, "gone": True}),
                turn("Booked", role="assistant", **{"app:version": 2}),
            ],
        )
        await client.delete_state("alice", ["gone"], session="s1")
        await client.delete_state("alice", ["user:lang"])
        await client.save_artifact("alice", "s1", "ticket.txt", b"LIS 2026-05-01", "text/plain")
        # A summary of the first two turns, as the summarizer publishes it.
        checkpoint = CheckpointSaved(
            app=APP, user="alice", session="s1", summary="Alice plans Lisbon.", up_to_seq=seqs[1]
        )
        ack = await client.nc.jetstream().publish(
            codec.subject_for(checkpoint), codec.encode(checkpoint), headers={"Nats-Msg-Id": codec.msg_id(checkpoint)}
        )
        await client.append("alice", "s1", turn("Thanks"))
        await client.append_many("bob", "s2", [turn(f"bob {i}", n=i) for i in range(30)])
        await client.append("alice", "gone-session", turn("forget me"))
        await client.delete_session("alice", "gone-session", missing_ok=True)
        last = await client.set_state("bob", {"user:plan": "pro"})
    async with await MemoryClient.connect(url, app=OTHER) as other:
        last = max(last, await other.append("carol", "c1", turn("another app")))
    assert ack.seq > seqs[1]
    await wait_committed(url, last)


async def snapshot(url: str) -> dict[str, Any]:
    """Everything SQL holds that a user sees, with stream sequences replaced by
    what they point at (the target's sequences are its own)."""
    engine = create_engine(url)
    S, E, A, C = models.SESSIONS, models.EVENTS, models.ARTIFACTS, models.CHECKPOINTS
    out: dict[str, Any] = {}
    try:
        async with engine.connect() as conn:
            sessions = (
                await conn.execute(
                    select(S.c.key, S.c.app, S.c.user_id, S.c.session_id, S.c.created_at, S.c.updated_at).where(
                        S.c.last_seq > S.c.deleted_seq
                    )
                )
            ).all()
            for key, app, user, session, created, updated in sessions:
                events = (
                    await conn.execute(
                        select(E.c.seq, E.c.event_id, E.c.data, E.c.tokens, E.c.timestamp)
                        .where(E.c.session_key == key)
                        .order_by(E.c.seq)
                    )
                ).all()
                event_at = {seq: event_id for seq, event_id, *_ in events}
                artifacts = (
                    await conn.execute(
                        select(A.c.artifact_id, A.c.filename, A.c.mime_type, A.c.inline, A.c.sha256, A.c.created_at)
                        .where(A.c.session_key == key)
                        .order_by(A.c.seq)
                    )
                ).all()
                checkpoints = (
                    await conn.execute(
                        select(C.c.checkpoint_id, C.c.summary, C.c.up_to_seq, C.c.tokens, C.c.created_at).where(
                            C.c.session_key == key
                        )
                    )
                ).all()
                out[f"{app}/{user}/{session}"] = {
                    "times": (created, updated),
                    "events": [(i, orjson.loads(d), t, ts) for _, i, d, t, ts in events],
                    "artifacts": [tuple(a) for a in artifacts],
                    "checkpoints": [(i, s, event_at[up], t, c) for i, s, up, t, c in checkpoints],
                    "state": await _state(conn, models.SESSION_STATE, models.SESSION_STATE.c.session_key == key),
                }
            for app, user, key in (
                await conn.execute(select(models.USERS.c.app, models.USERS.c.user_id, models.USERS.c.key))
            ).all():
                out[f"user {app}/{user}"] = await _state(conn, models.USER_STATE, models.USER_STATE.c.user_key == key)
            for (app,) in (await conn.execute(select(models.APP_STATE.c.app).distinct())).all():
                out[f"app {app}"] = await _state(conn, models.APP_STATE, models.APP_STATE.c.app == app)
    finally:
        await engine.dispose()
    return out


async def _state(conn, table, where) -> dict[str, Any]:
    rows = (await conn.execute(select(table.c.key, table.c.value).where(where))).all()
    return {k: orjson.loads(v) for k, v in rows if v != ""}  # "" is a deleted key's tombstone


async def every_row(url: str) -> dict[str, list]:
    """Every row of every table, sequences included: what must not change."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return {t.__tablename__: sorted(map(tuple, (await conn.execute(select(t))).all())) for t in models.TABLES}
    finally:
        await engine.dispose()


async def test_round_trip_postgres_to_sqlite_and_again(nats_url, target_nats, pg_url, sqlite_url, tmp_path):
    source = make_settings(nats_url, pg_url, tmp_path / "source")
    target = make_settings(target_nats.url, sqlite_url, tmp_path / "target")
    export = tmp_path / "export.jsonl"
    async with running_worker(source):
        await populate(nats_url)
        done = await run_memq(source, "export", "--out", str(export))
        assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in export.read_bytes().splitlines()]
    assert lines[0]["memq_export"] == 1 and lines[0]["source"] == "postgresql"
    assert lines[-1] == {"memq_export_end": 1, "records": len(lines) - 2}
    kinds = [line["message"]["kind"] for line in lines[1:-1]]
    assert "session.delete" not in kinds and kinds.count("session.create") == 3  # gone-session is not exported
    assert all(line["message"]["session"] != "gone-session" for line in lines[1:-1] if "session" in line["message"])
    expected = await snapshot(pg_url)
    assert "export-app/alice/gone-session" not in expected and expected["user export-app/alice"] == {"city": "Porto"}

    async with running_worker(target):
        first = await run_memq(target, "import", str(export))
        assert first.returncode == 0, first.stderr
        assert await snapshot(sqlite_url) == expected

        rows, last_seq = await every_row(sqlite_url), await stream_last_seq(target_nats.url)
        again = await run_memq(target, "import", str(export))
        assert again.returncode == 0, again.stderr
        assert "0 published" in again.stderr, again.stderr
        assert await stream_last_seq(target_nats.url) == last_seq  # nothing was published
        assert await every_row(sqlite_url) == rows


async def test_export_scopes_and_bad_lines(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path / "data")
    async with running_worker(settings):
        await populate(nats_url)
        one = await run_memq(settings, "export", "--app", APP, "--user", "bob", "--session", "s2")
        assert one.returncode == 0, one.stderr
        lines = [orjson.loads(line) for line in one.stdout.encode().splitlines()]
        assert {line["message"]["session"] for line in lines[1:-1]} == {"s2"}
        assert [line["message"]["kind"] for line in lines[1:-1]] == ["session.create", *["event"] * 30, "state.set"]
        assert all(line["seq"] is not None for line in lines[2:-1])
        earlier = tmp_path / "earlier.jsonl"
        earlier.write_bytes(one.stdout.encode())
        typo = await run_memq(settings, "export", "--app", APP, "--user", "bob", "--session", "s2x", "-o", str(earlier))
        assert typo.returncode == 1, typo.stderr
        assert typo.stderr.strip() == f"no such session 's2x' of user 'bob' in app '{APP}': nothing exported"
        assert earlier.read_bytes() == one.stdout.encode()  # not truncated by the typo
        apps = await run_memq(settings, "export", "--app", OTHER)
        assert {orjson.loads(line)["message"]["app"] for line in apps.stdout.splitlines()[1:-1]} == {OTHER}
        assert (await run_memq(settings, "export", "--user", "bob")).returncode == 2  # --user needs --app
        empty = await run_memq(settings, "export", "--app", "")  # an id no event has: refused, not an empty export
        assert (empty.returncode, empty.stderr.strip(), empty.stdout) == (2, "app must not be empty", "")

        good = lines[0:3]
        bad = tmp_path / "bad.jsonl"
        event = dict(lines[2]["message"], event=dict(lines[2]["message"]["event"], message={"role": "robot"}))
        body = [orjson.dumps(x).decode() for x in good] + [
            "{not json",
            orjson.dumps({"seq": 5, "message": event}).decode(),
            orjson.dumps(
                {"seq": 6, "message": {"v": 1, "kind": "session.delete", "app": APP, "user": "bob", "session": "s2"}}
            ).decode(),
            orjson.dumps({"memq_export_end": 1, "records": 5}).decode(),
        ]
        bad.write_text("\n".join(body) + "\n")
        before = await stream_last_seq(nats_url)
        result = await run_memq(settings, "import", str(bad))
        assert result.returncode == 1
        assert f"{bad}:4: not JSON" in result.stderr, result.stderr
        assert f"{bad}:5: invalid message: event.message.role" in result.stderr, result.stderr
        assert f"{bad}:6: a 'session.delete' message cannot be imported" in result.stderr, result.stderr
        assert "nothing was imported" in result.stderr
        assert await stream_last_seq(nats_url) == before

        truncated = tmp_path / "truncated.jsonl"
        truncated.write_text("\n".join(orjson.dumps(x).decode() for x in lines[:-1]) + "\n")
        result = await run_memq(settings, "import", str(truncated))
        assert result.returncode == 1 and "no footer" in result.stderr, result.stderr
        not_export = tmp_path / "notes.txt"
        not_export.write_text('{"hello": 1}\n')
        result = await run_memq(settings, "import", str(not_export))
        assert result.returncode == 1 and ":1: the first line must be the export header" in result.stderr, result.stderr
