"""The query worker's own check of reply subjects (workers/query/reply_subjects.py),
which holds without accounts: on a server with no auth, and so on a
one-account config from before `memq nats accounts` made one per app. Every
reply subject is watched by a plain subscriber (no auth: anyone may listen).

A service import's ``_R_.`` replies are answered too; a client cannot send
one (nats-server refuses a reply subject under ``_R_.``), so they are
covered by the accounts tests, where every app request arrives that way.
"""

from __future__ import annotations

import nats
import pytest
from helpers import make_settings, running_query, stays_false, wait_for

from memq.contracts.client import app_inbox_prefix, build_request, encode_request
from memq.contracts.subjects import dlq_subject, events_subject, request_subject
from memq.workers import metrics
from memq.workers.runtime import bus
from memq.workers.runtime.lease import BUCKET

pytestmark = pytest.mark.timeout(60)

A, B = "app-a", "team.b"

FOREIGN = [
    events_subject(B, "bob", "s"),  # B's event subject
    f"$KV.{BUCKET}.summarize.abc",  # the lease bucket
    f"{app_inbox_prefix(B)}.x",  # B's inbox
    dlq_subject("persistence"),
    f"{app_inbox_prefix(A)}x.y",  # only looks like A's inbox
]
OWN = f"{app_inbox_prefix(A)}.x"
MEMQS = "_INBOX.x"  # memq's own connections (CLI, admin, the gateway's shared one), a server without auth


def refused() -> float:
    return metrics.REGISTRY.get_sample_value("memq_query_replies_refused_total", {"op": "sessions.list"}) or 0.0


async def answered(nats_url: str, replies: list[str], expected: set[str]) -> None:
    """Requests on A's own subject, one per reply subject: exactly ``expected`` get answers."""
    nc = await nats.connect(nats_url, inbox_prefix=app_inbox_prefix(A))
    heard: set[str] = set()

    async def got(msg) -> None:
        heard.add(msg.subject)

    try:
        for reply in replies:
            await nc.subscribe(reply, cb=got)
        await bus.settle(nc)
        body = encode_request(build_request(A, "sessions.list", user="alice"))
        for reply in replies:
            await nc.publish(request_subject(A, "sessions.list"), body, reply=reply)
        await nc.request(request_subject(A, "sessions.list"), body, timeout=5)  # the barrier, on A's inbox

        async def all_there() -> bool:
            return expected <= heard

        await wait_for(all_there, 5, f"answers on {expected}")

        async def more() -> bool:
            return bool(heard - expected)

        await stays_false(more, 0.5, f"an answer on {heard - expected}")
    finally:
        await nc.close()


async def test_only_the_apps_inbox_and_memqs_own_inbox_are_answered(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_query(s):
        before = refused()
        await answered(nats_url, [OWN, MEMQS, *FOREIGN], {OWN, MEMQS})
        assert refused() - before == len(FOREIGN)


async def test_with_no_trusted_inboxes_only_the_apps_inbox_is_answered(nats_url, sqlite_url, tmp_path):
    """What a one-account config with app users sets: ``query.trusted_inboxes=[]``."""
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.query = s.query.model_copy(update={"trusted_inboxes": []})
    async with running_query(s):
        await answered(nats_url, [OWN, MEMQS, *FOREIGN], {OWN})
