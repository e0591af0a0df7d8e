"""memq.contracts.landing against a fake JetStream that deduplicates as the
real one does: by ``Nats-Msg-Id`` across the stream, whatever the subject."""

from __future__ import annotations

import asyncio

import pytest
from fakes import FakeNats
from nats.js.api import PubAck, RawStreamMsg
from nats.js.errors import NotFoundError

from memq.contracts.client import MemoryClient
from memq.contracts.errors import PublishFailed
from memq.contracts.landing import MSG_ID, publish_landed


class FakeStream:
    def __init__(self) -> None:
        self.messages: dict[int, tuple[str, bytes, dict[str, str]]] = {}
        self.ids: dict[str, int] = {}
        self.deleted: set[int] = set()

    async def publish(self, subject, data, stream=None, headers=None, timeout=None) -> PubAck:
        msg_id = (headers or {}).get(MSG_ID)
        if msg_id in self.ids:
            return PubAck(stream="S", seq=self.ids[msg_id], duplicate=True)
        seq = len(self.messages) + 1
        self.messages[seq] = (subject, data, dict(headers or {}))
        if msg_id:
            self.ids[msg_id] = seq
        return PubAck(stream="S", seq=seq)

    async def publish_async(self, subject, data, stream=None, headers=None) -> asyncio.Future[PubAck]:
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        future.set_result(await self.publish(subject, data, stream, headers))
        return future

    async def get_msg(self, stream, seq) -> RawStreamMsg:
        if seq not in self.messages or seq in self.deleted:
            raise NotFoundError
        subject, data, headers = self.messages[seq]
        return RawStreamMsg(subject=subject, seq=seq, data=data, headers=headers)


async def test_a_new_message_lands_once_and_its_retry_is_its_own_duplicate():
    js = FakeStream()
    first = await publish_landed(js, "ev.b", b"body", {MSG_ID: "id-1"}, "S")
    again = await publish_landed(js, "ev.b", b"body", {MSG_ID: "id-1"}, "S")
    assert (first.seq, first.stored_before, first.squatted) == (1, False, None)
    assert (again.seq, again.stored_before, again.squatted) == (1, True, None)
    assert len(js.messages) == 1


@pytest.mark.parametrize(
    "squat",
    [("ev.a", b"body"), ("ev.b", b"other"), ("ev.a", b"other")],
    ids=["same bytes on another subject", "other bytes on the subject", "neither"],
)
async def test_a_squatted_id_goes_again_under_a_fresh_one(squat):
    js = FakeStream()
    await js.publish(*squat, headers={MSG_ID: "id-1"})
    landed = await publish_landed(js, "ev.b", b"body", {MSG_ID: "id-1", "Other": "kept"}, "S")
    assert landed.squatted == "id-1" and landed.squatter_seq == 1 and not landed.stored_before
    assert landed.msg_id.startswith("id-1.") and landed.msg_id != "id-1"
    assert js.messages[landed.seq] == ("ev.b", b"body", {MSG_ID: landed.msg_id, "Other": "kept"})
    # The same fresh id again (a rerun that remembers it): its own duplicate, nothing new.
    rerun = await publish_landed(js, "ev.b", b"body", {MSG_ID: "id-1"}, "S", fresh=landed.msg_id)
    assert rerun.seq == landed.seq and rerun.stored_before and len(js.messages) == 2


async def test_a_duplicate_no_longer_in_the_stream_is_not_taken_as_landed():
    js = FakeStream()
    await js.publish("ev.a", b"body", headers={MSG_ID: "id-1"})
    js.deleted.add(1)  # the squatter purged its own message: the id stays in the window
    landed = await publish_landed(js, "ev.b", b"body", {MSG_ID: "id-1"}, "S")
    assert landed.squatted == "id-1" and js.messages[landed.seq][0] == "ev.b"


async def test_a_fresh_id_taken_too_fails_rather_than_reporting_success():
    js = FakeStream()
    await js.publish("ev.a", b"x", headers={MSG_ID: "id-1"})
    await js.publish("ev.a", b"x", headers={MSG_ID: "id-1.guessed"})
    with pytest.raises(PublishFailed, match="nothing was stored on ev.b"):
        await publish_landed(js, "ev.b", b"body", {MSG_ID: "id-1"}, "S", fresh="id-1.guessed")


@pytest.mark.parametrize("verify", [True, False])
async def test_the_client_verifies_duplicates_only_when_told(verify):
    """``memq import`` (verify_duplicates) gets its message stored; an app's
    client, which may not read the stream, takes the duplicate as its own."""
    js = FakeStream()
    await js.publish("ev.a", b"body", headers={MSG_ID: "id-1"})
    client = MemoryClient(FakeNats(js), "app", verify_duplicates=verify)
    seqs = await client._settle([("ev.b", b"body", {MSG_ID: "id-1"}), ("ev.b", b"next", {MSG_ID: "id-2"})])
    if verify:
        assert seqs == [3, 2] and client.squatted == 1 and js.messages[3][:2] == ("ev.b", b"body")
    else:
        assert seqs == [1, 2] and client.squatted == 0 and client.duplicates == 1
