"""`memq dlq list|replay` against a real NATS server and persistence worker:
a message dead-lettered for a reason an operator can fix is committed once the
cause is fixed and it is replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nats
from helpers import make_settings, running_worker, wait_for

from memq.contracts import codec
from memq.contracts.schemas import Event, EventAppended, Message, TextPart
from memq.contracts.subjects import events_subject
from memq.workers.sql import reads

MEMQ = str(Path(sys.prefix) / "bin" / "memq")
APP = "dlq-app"


def memq(nats_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(MEMQ_DATA_DIR=str(tmp_path), MEMQ_NATS__URL=nats_url, MEMQ_LOG_LEVEL="WARNING")
    return subprocess.run([MEMQ, *args], env=env, capture_output=True, text=True, timeout=60)


def text_event(text: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))


async def dlq_count(js) -> int:
    return (await js.stream_info("MEMQ_DLQ")).state.messages


async def test_list_shows_reasons_and_replay_commits_once_fixed(nats_url, sqlite_url, tmp_path):
    big = EventAppended(app=APP, user="u", session="s", event=text_event("x" * 2500))
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    strict = make_settings(nats_url, sqlite_url, tmp_path)
    strict.streams.max_message_bytes = 2000  # the cause an operator will fix
    async with running_worker(strict) as worker:
        await js.publish(events_subject(APP, "u", "s"), b"{not json")
        await js.publish(codec.subject_for(big), codec.encode(big))
        await wait_for(lambda: _equals(dlq_count(js), 2), what="two dead letters")

        listed = memq(nats_url, tmp_path, "dlq", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        letters = json.loads(listed.stdout)
        assert [(x["worker"], x["code"]) for x in letters] == [
            ("persistence", "invalid_message"),
            ("persistence", "oversize"),
        ]
        assert all(x["reason"] and x["original_subject"] == events_subject(APP, "u", "s") for x in letters)
        only = json.loads(memq(nats_url, tmp_path, "dlq", "list", "--code", "oversize", "--json").stdout)
        assert [x["seq"] for x in only] == [letters[1]["seq"]]
        table = memq(nats_url, tmp_path, "dlq", "list")
        assert "oversize" in table.stdout and "persistence/oversize: 1" in table.stdout.replace("\n", "")

    # The operator raises the limit and restarts the worker, then replays.
    fixed = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(fixed) as worker:
        replay = memq(nats_url, tmp_path, "dlq", "replay", "--all", "--code", "oversize")
        assert replay.returncode == 0, replay.stderr
        assert "1 replayed" in replay.stdout
        await wait_for(lambda: _has(worker.live.engine, big.event.id), what="the replayed event in SQL")
        assert await dlq_count(js) == 1  # the garbage stays

        # Garbage replayed is dead-lettered again, with its reason: never lost.
        seq = letters[0]["seq"]
        again = memq(nats_url, tmp_path, "dlq", "replay", str(seq))
        assert again.returncode == 0, again.stderr
        await wait_for(lambda: _equals(dlq_count(js), 1), what="the garbage back in the DLQ")
        (back,) = json.loads(memq(nats_url, tmp_path, "dlq", "list", "--json").stdout)
        assert back["code"] == "invalid_message" and back["seq"] != seq

        # Replaying the same event again does not double it (keyed by event id).
        await js.publish(codec.subject_for(big), codec.encode(big))
        events = await reads.events(worker.live.engine, APP, "u", "s")
        assert [e.event_id for e in events].count(big.event.id) == 1
    await nc.close()


async def test_replay_with_keep_twice_appends_once(nats_url, sqlite_url, tmp_path):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    async with running_worker(make_settings(nats_url, sqlite_url, tmp_path)):
        await js.publish(events_subject(APP, "u", "s"), b"[1, 2")
        await wait_for(lambda: _equals(dlq_count(js), 1), what="a dead letter")
        before = (await js.stream_info("MEMQ_EVENTS")).state.last_seq
        for _ in range(2):
            out = memq(nats_url, tmp_path, "dlq", "replay", "--all", "--keep")
            assert out.returncode == 0, out.stderr
        # The second replay carries the same Nats-Msg-Id: JetStream drops it.
        assert (await js.stream_info("MEMQ_EVENTS")).state.last_seq == before + 1
    await nc.close()


def test_replay_needs_a_choice_and_names_unknown_seqs(nats_url, tmp_path):
    nothing = memq(nats_url, tmp_path, "dlq", "replay")
    assert nothing.returncode == 2 and "--all" in nothing.stderr
    missing = memq(nats_url, tmp_path, "dlq", "replay", "999999")
    # One message, not an error followed by a count that reads as done.
    assert missing.returncode == 1 and missing.stdout == "", missing.stdout
    assert missing.stderr.strip().splitlines() == ["no dead letter 999999 in MEMQ_DLQ: see `memq dlq list`"]
    empty = memq(nats_url, tmp_path, "dlq", "list")
    assert empty.returncode == 0 and "no dead letters" in empty.stdout


async def _equals(awaitable, value) -> bool:
    return (await awaitable) == value


async def _has(engine, event_id: str) -> bool:
    return event_id in [e.event_id for e in await reads.events(engine, APP, "u", "s")]


async def test_a_decoder_bug_dead_letters_one_message_and_the_batch_goes_on(
    nats_url, sqlite_url, tmp_path, monkeypatch
):
    import memq.workers.persistence.worker as persistence

    real = persistence.decode_from_subject

    def flaky(subject, data, **kw):
        if b"trigger-the-bug" in data:
            raise TypeError("unhashable type: 'list'")  # what a poison pill looked like
        return real(subject, data, **kw)

    monkeypatch.setattr(persistence, "decode_from_subject", flaky)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    bad = EventAppended(app=APP, user="u", session="s", event=text_event("trigger-the-bug"))
    good = EventAppended(app=APP, user="u", session="s", event=text_event("fine"))
    async with running_worker(make_settings(nats_url, sqlite_url, tmp_path)) as worker:
        for message in (bad, good):  # one batch
            await js.publish(codec.subject_for(message), codec.encode(message))
        await wait_for(lambda: _has(worker.live.engine, good.event.id), what="the good event")
        await wait_for(lambda: _equals(dlq_count(js), 1), what="the bad one dead-lettered")
        (letter,) = json.loads(memq(nats_url, tmp_path, "dlq", "list", "--json").stdout)
        assert letter["code"] == "internal" and "TypeError" in letter["reason"]
    await nc.close()
