"""Deleting state keys (``MemoryClient.delete_state``, ``StateSet.delete``)
through the real persistence worker, read back from SQL and through the
query worker, in the session, ``user:`` and ``app:`` scopes."""

from __future__ import annotations

import pytest
from helpers import make_settings, running_query, running_worker
from pydantic import ValidationError

from memq.contracts.client import MemoryClient
from memq.contracts.codec import encode
from memq.contracts.errors import InvalidMessage
from memq.contracts.schemas import StateSet
from memq.workers.memory.commit_plan import Incoming
from memq.workers.persistence.store import SqlStore
from memq.workers.sql import reads

APP = "state-del"


@pytest.mark.parametrize("db", ["sqlite_url", "pg_url", "mariadb_url"])
async def test_deleted_keys_are_gone_and_a_later_set_brings_them_back(request, db, nats_url, tmp_path):
    url = request.getfixturevalue(db)
    settings = make_settings(nats_url, url, tmp_path)
    async with running_worker(settings) as worker, running_query(settings):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.create_session("u", "s", state={"topic": "taxes", "mood": "calm", "user:lang": "pt"})
            await client.set_state("u", {"app:model": "m1", "app:tone": "formal", "user:city": "Porto"})
            await client.set_state("u", {"nothing": None}, session="s")  # null is a value, kept
            assert await client.get_state("u", "s") == {
                "topic": "taxes",
                "mood": "calm",
                "nothing": None,
                "user:lang": "pt",
                "user:city": "Porto",
                "app:model": "m1",
                "app:tone": "formal",
            }

            await client.delete_state("u", ["topic", "user:lang", "app:model", "never:set"], session="s")
            await client.delete_state("u", "user:city")  # one key, no session: user and app keys only
            # Read-your-writes covers deletes, and they invalidate the cached state.
            assert await client.get_state("u", "s") == {"mood": "calm", "nothing": None, "app:tone": "formal"}
            assert await client.get_state("u") == {"app:tone": "formal"}
            assert (await client.get_session("u", "s")).state == {"mood": "calm", "nothing": None, "app:tone": "formal"}

            # Set again after the delete: the key is back.
            await client.set_state("u", {"topic": "travel", "user:lang": "en"}, session="s")
            assert await client.get_state("u", "s") == {
                "topic": "travel",
                "mood": "calm",
                "nothing": None,
                "user:lang": "en",
                "app:tone": "formal",
            }
            # SQL as the worker left it: the same merged state.
            assert await reads.state(worker.live.engine, APP, "u", "s") == await client.get_state("u", "s")

            # A lagging replica commits a set from before a delete after it:
            # the tombstone's seq is newer, so the key stays deleted.
            gone = await client.delete_state("u", ["mood", "user:lang", "app:tone"], session="s")
            await client.get_state("u", "s")  # committed
            stale = StateSet(app=APP, user="u", session="s", delta={"mood": "angry", "user:lang": "x", "app:tone": "y"})
            await SqlStore(worker.live.engine).commit([Incoming(gone - 1, stale)])
            assert await reads.state(worker.live.engine, APP, "u", "s") == {"topic": "travel", "nothing": None}

            with pytest.raises(InvalidMessage):
                await client.delete_state("u", ["topic"])  # a session key needs a session
            with pytest.raises(InvalidMessage):
                await client.delete_state("u", [""], session="s")


def test_one_message_cannot_set_and_delete_one_key():
    with pytest.raises(ValidationError, match="both set and deleted"):
        StateSet(app=APP, user="u", session="s", delta={"k": 1}, delete=["k"])
    # Without deletes the message is encoded as before (older workers read it).
    assert b"delete" not in encode(StateSet(app=APP, user="u", delta={"user:k": 1}))
