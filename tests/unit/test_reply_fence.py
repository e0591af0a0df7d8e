"""Which reply subjects the query worker answers (memq.workers.query.reply_subjects)."""

from __future__ import annotations

from memq.contracts.client import app_inbox_prefix
from memq.contracts.subjects import events_subject, request_subject
from memq.workers.query.reply_subjects import ReplyFence, trusted_prefixes

ON_A = request_subject("team.a", "history")  # an app whose token is escaped


def test_the_apps_own_inbox_and_service_import_replies_are_answered():
    fence = ReplyFence(trusted_prefixes([], None))
    assert fence.allows(ON_A, f"{app_inbox_prefix('team.a')}.nuid.1")
    assert fence.allows(ON_A, "_R_.abc.def")
    for foreign in (
        f"{app_inbox_prefix('team.b')}.nuid.1",
        f"{app_inbox_prefix('team.a')}x.1",  # a prefix of the token is not the app's
        app_inbox_prefix("team.a"),  # the bare prefix: nobody's inbox
        events_subject("team.b", "bob", "s"),
        "$KV.MEMQ_LEASES.summarize.k",
        "memq.v1.dlq.persistence",
        "$JS.API.STREAM.PURGE.MEMQ_EVENTS",
        "_INBOX.x",
        "",
    ):
        assert not fence.allows(ON_A, foreign), foreign


def test_trusted_inboxes_default_to_this_processs_own():
    assert trusted_prefixes(None, None) == ("_INBOX.",)
    assert trusted_prefixes(None, "_INBOX_memq") == ("_INBOX_memq.",)
    assert trusted_prefixes(["_INBOX", "ops."], None) == ("_INBOX.", "ops.")
    fence = ReplyFence(trusted_prefixes(None, None))
    assert fence.allows(ON_A, "_INBOX.abc") and not fence.allows(ON_A, "_INBOX_other.abc")


def test_a_malformed_app_token_is_never_answered():
    fence = ReplyFence(())
    assert not fence.allows("memq.v1.q.bad~zz.history", "_INBOX_bad~zz.x")
    assert not fence.allows("memq.v1.q", "_INBOX_.x")
