"""NATS permissions for memq (memq.workers.security): what each app's user may touch."""

from __future__ import annotations

import json
import re

import bcrypt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.contracts.client import app_inbox_prefix
from memq.contracts.errors import InvalidId
from memq.contracts.subjects import events_subject, request_subject, status_subject
from memq.workers import security
from memq.workers.indexing import rebuild_job

ids = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 256)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more at the end."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def allowed(patterns, subject: str) -> bool:
    return any(matches(p, subject) for p in patterns)


def test_matcher_itself():
    assert matches("a.>", "a.b.c") and not matches("a.>", "a")
    assert matches("a.*.c", "a.b.c") and not matches("a.*", "a.b.c")
    assert not matches("_INBOX_A.>", "_INBOX_AB.x")


def test_an_app_may_write_and_ask_only_under_its_own_token():
    p = security.app_permissions("support-bot")
    assert allowed(p.publish, events_subject("support-bot", "u1", "s1"))
    assert allowed(p.publish, events_subject("support-bot", "u1"))  # user-scoped: delete user, user state
    assert allowed(p.publish, request_subject("support-bot", "session.get"))
    assert allowed(p.subscribe, status_subject("support-bot", "u1", "s1"))
    assert allowed(p.subscribe, f"{app_inbox_prefix('support-bot')}.NUID.token")
    for forbidden in (
        "$JS.API.CONSUMER.CREATE.MEMQ_EVENTS",
        "$JS.API.STREAM.INFO.MEMQ_EVENTS",
        "_INBOX.x",
        "memq.v1.changed.support-bot.u1.s1",
        "memq.v1.dlq.persistence",
        "$O.MEMQ_ARTIFACTS.C.x",
    ):
        assert not allowed(p.publish, forbidden) and not allowed(p.subscribe, forbidden), forbidden
    assert not p.allow_responses


@settings(max_examples=300, deadline=None)
@given(a=ids, b=ids, user=ids, session=ids)
def test_no_app_reaches_another_apps_subjects(a, b, user, session):
    if a == b:
        return
    pa = security.app_permissions(a)
    theirs = [events_subject(b, user, session), events_subject(b, user), request_subject(b, "history")]
    assert not any(allowed(pa.publish, s) for s in theirs)
    assert not allowed(pa.subscribe, status_subject(b, user, session))
    assert not allowed(pa.subscribe, f"{app_inbox_prefix(b)}.x.y")


def test_render_is_a_valid_accounts_block_with_hashes():
    plain, hashed = security.generate_passwords(security.user_names(["a", "b.c"]))
    memq, system = security.build_users(["a", "b.c"], hashed)
    text = security.render_accounts(memq, system, header="test")
    assert "system_account: SYS" in text and "jetstream: enabled" in text
    for name, h in hashed.items():
        assert json.dumps(h) in text  # quoted: never read as a $variable
        assert plain[name] not in text
        assert bcrypt.checkpw(plain[name].encode(), h.encode())
    assert '"memq.v1.ev.b~2Ec.>"' in text and '"_INBOX_b~2Ec.>"' in text


def test_env_password_references_and_their_names():
    names = security.user_names(["my.bot"], admin=False)
    assert names == ["workers", "app-my~2Ebot", "sys"]
    assert security.env_var("app-my~2Ebot") == "MEMQ_NATS_PASSWORD_APP_MY_2EBOT"
    memq, system = security.build_users(["my.bot"], {n: "$" + security.env_var(n) for n in names}, admin=False)
    text = security.render_accounts(memq, system)
    assert "password: $MEMQ_NATS_PASSWORD_WORKERS\n" in text  # bare: a variable
    assert "admin" not in text


def test_users_that_would_share_a_variable_are_refused():
    # "a-b" and "a_b" both become ..._APP_A_B
    names = security.user_names(["a-b", "a_b"])
    with pytest.raises(ValueError, match="same password variable"):
        security.build_users(["a-b", "a_b"], {n: "x" for n in names})
    with pytest.raises(ValueError, match="twice"):
        security.build_users(["a", "a"], {})
    with pytest.raises(InvalidId):
        security.app_permissions("")


def test_credentials_document_carries_each_apps_inbox_and_server_hashes():
    names = security.user_names(["a"])
    plain, hashed = {n: f"pw-{n}" for n in names}, {n: f"$2b$04$hash-{n}" for n in names}
    memq, system = security.build_users(["a"], hashed)
    doc = security.credentials_document(memq, system, plain, hashed)
    app = doc["users"]["app-a"]
    assert app["env"] == {
        "MEMQ_NATS__USER": "app-a",
        "MEMQ_NATS__PASSWORD": "pw-app-a",
        "MEMQ_NATS__INBOX_PREFIX": "_INBOX_a",
    }
    assert doc["server_env"]["MEMQ_NATS_PASSWORD_APP_A"] == '"$2b$04$hash-app-a"'
    assert set(doc["users"]) == {"workers", "admin", "app-a", "sys"}


def test_each_app_is_an_account_that_imports_only_its_own_subjects():
    memq, system = security.build_users(["a", "b.c"], {n: "x" for n in security.user_names(["a", "b.c"])})
    text = security.render_accounts(memq, system)
    memq_block = text[text.index("  MEMQ: {") : text.index('  "APP_a": {')]
    assert '"workers"' in memq_block and '"admin"' in memq_block and '"app-a"' not in memq_block
    for app, token in (("a", "a"), ("b.c", "b~2Ec")):
        account = security.app_account(app)
        assert account == f"APP_{token}"
        exported = [e.subject for e in security.app_exports(app)]
        assert exported == [f"memq.v1.ev.{token}.>", f"memq.v1.q.{token}.>", f"memq.v1.status.{token}.>"]
        for e in security.app_exports(app):  # to this app's account alone
            assert f'{{ {e.kind}: "{e.subject}", accounts: ["{account}"] }}' in memq_block
        block = text[text.index(f'  "{account}": {{') :].split("\n  }", 1)[0]
        assert f'user: "{security.app_user_name(app)}"' in block and "jetstream" not in block
        imports = re.findall(r'\{ (service|stream): \{ account: MEMQ, subject: "([^"]+)" \} \}', block)
        assert imports == [(e.kind, e.subject) for e in security.app_exports(app)]


def test_workers_publish_only_what_they_need():
    p = security.WORKER_PERMISSIONS
    for wide in ("memq.v1.>", "$KV.>", "$O.>", ">"):
        assert wide not in p.publish
    assert allowed(p.publish, "$KV.MEMQ_LEASES.summarize.k") and not allowed(p.publish, "$KV.OTHER.k")
    assert allowed(p.publish, "$O.MEMQ_ARTIFACTS.C.x") and not allowed(p.publish, "$O.OTHER.C.x")
    assert allowed(p.publish, f"$KV.{rebuild_job.BUCKET}.done.g2.indexing-h-1-ab12")  # a replica's share of a rebuild
    for needed in ("memq.v1.ev.a.u.s", "memq.v1.changed.a.u.s", "memq.v1.committed.memq-persistence"):
        assert allowed(p.publish, needed), needed
    assert allowed(p.publish, "memq.v1.status.a.u.s") and allowed(p.publish, "memq.v1.dlq.persistence")
    assert p.allow_responses


def test_each_user_says_its_account():
    names = security.user_names(["a"])
    memq, system = security.build_users(["a"], {n: f"$2b$04$h-{n}" for n in names})
    doc = security.credentials_document(memq, system, {n: n for n in names}, {n: f"h-{n}" for n in names})
    assert {n: u["account"] for n, u in doc["users"].items()} == {
        "workers": "MEMQ",
        "admin": "MEMQ",
        "app-a": "APP_a",
        "sys": "SYS",
    }
    assert doc["account"] == "MEMQ"  # the one with JetStream (KEDA reads its consumers there)
