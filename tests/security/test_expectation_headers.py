"""App A learns nothing about app B from JetStream's answers (issue 38,
finding 6), on the multi-tenant stack (``conftest.py``).

With one shared stream, JetStream evaluated A's expectation headers against
every app's messages, and A, publishing on its own subject, learnt B's last
event id in clear text (``Nats-Expected-Last-Msg-Id``), the last sequence of
any subject of B's (``Nats-Expected-Last-Subject-Sequence`` with
``…-Subject: memq.v1.ev.team~2Eb.bob.>``), whether a user of B's exists, and
from the stream-wide sequences of refusals and PubAcks, when B writes. Now
each app has a stream of its own: every answer A gets is computed over A's
messages alone, so it is the same whatever B has or does.
"""

from __future__ import annotations

import nats.js.errors
import pytest

from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import app_events_stream, events_subject

from .conftest import A, B

pytestmark = pytest.mark.timeout(120)

LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
LAST_SEQ = "Nats-Expected-Last-Sequence"
LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
NEVER = "999999999"  # an expectation no stream here meets: every probe is refused, with what the server saw


def said(text: str, id: str | None = None) -> Event:
    event = Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))
    return event if id is None else event.model_copy(update={"id": id})


async def _answer(js, headers: dict[str, str]) -> str:
    """What JetStream tells A for a probe on A's own subject: its refusal
    (which carries what the server compared with), or the sequence it was
    stored at."""
    try:
        ack = await js.publish(events_subject(A, "alice", "probe"), b"probe", headers=headers)
    except nats.js.errors.APIError as exc:
        return f"refused {exc.err_code}: {exc.description}"
    return f"stored at {ack.seq}"


async def test_expectation_headers_answer_from_a_s_messages_alone(tenants):
    a = await tenants.app(A)
    b = await tenants.client(B)
    alice = await tenants.client(A)
    js = a.jetstream()
    try:
        await alice.append("alice", "own", said("A's own turn"))
        await b.append("bob", "secret-session", said("B's secret", id="b-evt-42"))
        b_last = await tenants.admin.jetstream().get_last_msg(
            app_events_stream(B), events_subject(B, "bob", "secret-session")
        )
        b_id = (b_last.headers or {})["Nats-Msg-Id"]

        # The last message id: A's own, never B's.
        answer = await _answer(js, {LAST_MSG_ID: "x"})
        assert "b-evt-42" not in answer and b_id not in answer and b_id.split(".")[0] not in answer, answer

        # A subject of B's, named in the override, looks exactly like one nobody has.
        probes = {
            who: await _answer(js, {LAST_SUBJECT_SEQ: NEVER, LAST_SUBJECT_SEQ_SUBJECT: f"memq.v1.ev.team~2Eb.{who}.>"})
            for who in ("bob", "nobody")
        }
        assert probes["bob"] == probes["nobody"], probes
        assert probes["bob"].endswith("wrong last sequence: 0"), probes

        # Stream-wide sequences: B's writes move none of A's answers.
        before = await _answer(js, {LAST_SEQ: NEVER})
        first = await alice.append("alice", "own", said("A, before B writes"))
        for i in range(5):
            await b.append("bob", "secret-session", said(f"B writes {i}"))
        second = await alice.append("alice", "own", said("A, after B wrote"))
        after = await _answer(js, {LAST_SEQ: NEVER})
        assert second == first + 1, f"A's sequences jumped from {first} to {second} while B wrote"
        # The stream's last sequence, as a refusal says it: A's own last write each time.
        assert before.endswith(f"wrong last sequence: {first - 1}"), before
        assert after.endswith(f"wrong last sequence: {second}"), after
    finally:
        await alice.close()
        await b.close()
        await a.close()
