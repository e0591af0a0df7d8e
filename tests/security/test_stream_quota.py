"""One app cannot fill the store for the others (issue 38, finding 4), on the
multi-tenant stack (``conftest.py``).

Every app shared ``MEMQ_EVENTS``, with no per-app limit: on a scaled-down
server A stored 26 × 1 MB on its own subject, and then B's next append
failed with ``PublishFailed … insufficient resources``. Now each app has a
stream of its own (``streams.apps``) with a quota (discard new): C, with a
2 MB quota, fills it with its own credentials, and its next write is refused
as ``QuotaExceeded`` naming C's stream and quota; B's writes and reads go on,
and nothing C stored before is lost.
"""

from __future__ import annotations

import pytest

from memq.contracts.errors import QuotaExceeded
from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import app_events_stream

from .conftest import C_QUOTA, B, C

pytestmark = pytest.mark.timeout(120)

CHUNK = 200 * 1024  # characters of one of C's turns


def said(text: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))


async def test_an_app_that_fills_its_quota_is_refused_and_the_others_go_on(tenants):
    c = await tenants.client(C)
    b = await tenants.client(B)
    try:
        stored = 0
        with pytest.raises(QuotaExceeded) as refused:
            for i in range(4 * C_QUOTA // CHUNK):  # well past the quota: it must refuse before
                await c.append(f"carol-{i % 4}", "filler", said(f"{i} " + "x" * CHUNK))
                stored += 1
        assert 0 < stored <= C_QUOTA // CHUNK, f"C stored {stored} turns of {CHUNK} bytes under a {C_QUOTA}-byte quota"
        message = str(refused.value)
        assert app_events_stream(C) in message and "quota" in message and repr(C) in message, message
        assert refused.value.code == "quota_exceeded" and refused.value.http_status == 507

        # B is not affected: it appends and reads its own turn back at once.
        seq = await b.append("bob", "next-door", said("B still writes"))
        history = await b.history("bob", "next-door")
        assert [e.seq for e in history.events] == [seq]

        # What C stored before the refusal is all there (discard new, not old).
        info = await tenants.admin.jetstream().stream_info(app_events_stream(C))
        assert info.state.messages == stored
        assert info.config.max_bytes == C_QUOTA
    finally:
        await c.close()
        await b.close()
