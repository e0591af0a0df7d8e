"""Who may do what on the bus: NATS accounts, users and permissions for memq
(pure, no I/O).

One account (``MEMQ``) holds JetStream, so every worker kind shares the one
event stream. Each app has an account of its own (``APP_<app token>``) that
reaches memq's only through what ``MEMQ`` exports to that account alone:

- a service import of ``memq.v1.ev.<app>.>`` (its writes: the stream
  captures them in ``MEMQ``, and JetStream's PubAck travels back through the
  import to the app's own inbox);
- a service import of ``memq.v1.q.<app>.>`` (its reads);
- a stream import of ``memq.v1.status.<app>.>`` (its status notices).

Why accounts and not only permissions: NATS checks a publish's subject
against the permissions, never its reply subject, and whatever answers (the
query worker, JetStream's PubAck) writes where the requester named. In one
shared account an app could name any subject of memq's (another app's event
subject, the lease bucket, the DLQ, another app's inbox). Through an import
the server replaces the reply with a ``_R_.…`` subject of its own, mapped
back to the app's account: an app cannot name a subject in ``MEMQ`` at all.
An export lists the one account allowed to import it, so the server refuses
a config where an app imports another's subjects.

The users:

- ``workers`` (``MEMQ``): the worker processes. They consume the stream,
  publish commit notices, summaries and dead letters, use the lease KV bucket
  and the artifact object store, answer ``$SRV`` status pings, and reply to
  requests (``allow_responses``: a reply goes to the requester's inbox,
  whatever its prefix).
- ``admin`` (``MEMQ``, optional): operators' commands (``memq init``,
  ``status``, ``dlq``, ``index rebuild``): everything in the account.
- one user per app, alone in its app's account: publish only on
  ``memq.v1.ev.<app>.>`` (its writes) and ``memq.v1.q.<app>.>`` (its reads);
  subscribe only on its own inbox prefix (replies, PubAcks) and
  ``memq.v1.status.<app>.>``. No ``$JS.API`` (its account has no JetStream;
  with memq's an app could create a consumer and read every app's events).
  The inbox stays per app (``_INBOX_<app>``, see
  :func:`memq.contracts.client.app_inbox_prefix`), as in the one-account
  configs before, so clients need no new option.

Large artifacts: the object store's subjects (``$O.<bucket>.C.<nuid>``) do
not carry the app, so they are not exported. App users therefore store
artifacts inline only (up to the client's ``inline_artifact_limit``); a
larger one fails with :class:`~memq.contracts.errors.PublishFailed`.

Passwords are stored as bcrypt hashes, which nats-server checks itself: the
config file (often a Kubernetes ConfigMap, readable by many) then holds no
secret. NKeys would also keep secrets out of the config, but every agent
would need the ``nkeys`` package and a seed file instead of a password from
its usual secret store; bcrypt keeps ``MEMQ_NATS__USER``/``PASSWORD`` as is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from memq.contracts.client import app_inbox_prefix
from memq.contracts.ids import encode_token
from memq.contracts.subjects import ARTIFACT_BUCKET, PREFIX
from memq.workers.runtime.lease import BUCKET as LEASE_BUCKET

# memq.workers.indexing.rebuild_job.BUCKET, spelled here: the gateway imports
# this module and may not import the indexing worker (tests/unit/test_nats_permissions.py).
REBUILD_BUCKET = "MEMQ_REBUILD"

ACCOUNT = "MEMQ"
APP_ACCOUNT_PREFIX = "APP_"
SYSTEM_ACCOUNT = "SYS"
WORKERS = "workers"
ADMIN = "admin"
SYSTEM_USER = "sys"
BCRYPT_COST = 11  # the `nats` CLI's default: ~0.1 s per connect, only at connect
ENV_PREFIX = "MEMQ_NATS_PASSWORD_"


@dataclass(frozen=True)
class Permissions:
    """NATS subject permissions (allow lists; anything else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False


@dataclass(frozen=True)
class User:
    """A NATS user; ``password`` is what goes into the config: a bcrypt hash,
    or ``$NAME`` to read it (plain or hashed) from the server's environment."""

    name: str
    password: str
    permissions: Permissions | None = None  # None: everything in the account
    app: str | None = None


# What the workers do on the bus, found by running every worker kind against a
# server with these permissions (tests/integration/test_security.py checks the
# server logged no violation for them). Replies (to queries, $SRV pings) need
# no publish grant: allow_responses covers each requester's inbox. Each
# memq.v1 kind is named rather than memq.v1.>, and the lease and rebuild buckets and the
# artifact store rather than $KV.> and $O.>: what a worker never publishes
# it cannot be tricked into publishing. $JS.API.> stays: stream, consumer,
# KV and object-store calls put configurable names at varying positions.
WORKER_PERMISSIONS = Permissions(
    publish=(
        f"{PREFIX}.ev.>",  # summaries, expiry deletions; the gateway's appends for apps without a user
        f"{PREFIX}.q.>",  # the gateway's and the CLI's reads on the workers' connection
        f"{PREFIX}.changed.>",  # commit notices
        f"{PREFIX}.committed.>",  # finished batches (read-your-writes)
        f"{PREFIX}.status.>",  # "summarizing" notices
        f"{PREFIX}.dlq.>",  # dead letters
        "$JS.API.>",  # streams, consumers, fetch, KV and object store setup
        "$JS.ACK.>",  # acks, naks, in-progress
        "$JS.FC.>",  # flow control of the ordered consumer that lists objects (once a listing is large)
        f"$KV.{LEASE_BUCKET}.>",  # the summarizer's, expiry's and rebuild's leases
        f"$KV.{REBUILD_BUCKET}.>",  # each indexing replica's share of a rebuild
        f"$O.{ARTIFACT_BUCKET}.>",  # large artifacts: listed and deleted with their session
    ),
    subscribe=(
        f"{PREFIX}.>",  # commit notices, requests (queue groups)
        "_INBOX.>",  # replies: JetStream API, fetched messages, KV/object reads
        "$SRV.>",  # answering `memq status`
    ),
    allow_responses=True,  # replies to each app's own inbox prefix
)


@dataclass(frozen=True)
class Export:
    """What ``MEMQ`` exports to one app's account, which imports the same subject."""

    kind: Literal["service", "stream"]
    subject: str


def app_user_name(app: str) -> str:
    return f"app-{encode_token(app, 'app')}"


def app_account(app: str) -> str:
    """The app's own NATS account (the token is the reversible id encoding)."""
    return APP_ACCOUNT_PREFIX + encode_token(app, "app")


def app_exports(app: str) -> tuple[Export, ...]:
    """Everything app ``app`` reaches of memq's account: its writes (the
    PubAck comes back through the service import), its reads, its status."""
    token = encode_token(app, "app")
    return (
        Export("service", f"{PREFIX}.ev.{token}.>"),
        Export("service", f"{PREFIX}.q.{token}.>"),
        Export("stream", f"{PREFIX}.status.{token}.>"),
    )


def app_permissions(app: str) -> Permissions:
    """Only app ``app``'s own event and request subjects, its own inbox and
    status notices (the token is the reversible id encoding: one id, one token)."""
    token = encode_token(app, "app")
    return Permissions(
        publish=(f"{PREFIX}.ev.{token}.>", f"{PREFIX}.q.{token}.>"),
        subscribe=(f"{app_inbox_prefix(app)}.>", f"{PREFIX}.status.{token}.>"),
    )


def env_var(user: str) -> str:
    """The server-side variable that holds ``user``'s password in an
    ``--env-passwords`` config (``app-my.bot`` -> ``MEMQ_NATS_PASSWORD_APP_MY_BOT``)."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", user).upper()


def build_users(
    apps: Sequence[str], passwords: Mapping[str, str], *, admin: bool = True, system_user: bool = True
) -> tuple[list[User], list[User]]:
    """(memq account users, system account users). ``passwords`` maps a user
    name to its config value (a bcrypt hash or ``$VAR``)."""
    if len(set(apps)) != len(apps):
        raise ValueError("an app is listed twice")
    names = [WORKERS] + ([ADMIN] if admin else []) + [app_user_name(a) for a in apps]
    memq = [User(WORKERS, passwords[WORKERS], WORKER_PERMISSIONS)]
    if admin:
        memq.append(User(ADMIN, passwords[ADMIN]))
    memq += [User(app_user_name(a), passwords[app_user_name(a)], app_permissions(a), app=a) for a in apps]
    system = [User(SYSTEM_USER, passwords[SYSTEM_USER])] if system_user else []
    env_names = [env_var(n) for n in names + [u.name for u in system]]
    if len(set(env_names)) != len(env_names):
        raise ValueError("two users map to the same password variable; rename an app")
    return memq, system


# --- rendering ----------------------------------------------------------------


def _q(value: str) -> str:
    # JSON string escapes are what the NATS config parser understands; a
    # quoted string is never read as a $variable (bcrypt hashes start with $).
    return json.dumps(value)


def _value(password: str) -> str:
    return (
        password if password.startswith("$") and re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", password) else _q(password)
    )


def _list(subjects: Iterable[str]) -> str:
    return "[" + ", ".join(_q(s) for s in subjects) + "]"


def _user(u: User, indent: str) -> str:
    lines = [f"{indent}{{", f"{indent}  user: {_q(u.name)}", f"{indent}  password: {_value(u.password)}"]
    if u.app is not None:
        lines.insert(1, f"{indent}  # app {json.dumps(u.app, ensure_ascii=True)}")
    if u.permissions is not None:
        p = u.permissions
        lines.append(f"{indent}  permissions: {{")
        lines.append(f"{indent}    publish: {{ allow: {_list(p.publish)} }}")
        lines.append(f"{indent}    subscribe: {{ allow: {_list(p.subscribe)} }}")
        if p.allow_responses:
            lines.append(f"{indent}    allow_responses: true")
        lines.append(f"{indent}  }}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def _export(e: Export, account: str, indent: str) -> str:
    return f"{indent}{{ {e.kind}: {_q(e.subject)}, accounts: [{_q(account)}] }}"


def _import(e: Export, indent: str) -> str:
    return f"{indent}{{ {e.kind}: {{ account: {ACCOUNT}, subject: {_q(e.subject)} }} }}"


def render_accounts(memq: Sequence[User], system: Sequence[User], *, header: str = "") -> str:
    """The ``accounts { ... }`` block and ``system_account`` of a nats-server
    config (for ``include accounts.conf``): ``MEMQ`` with the users that are
    no app's and an export per app, then one account per app user with its
    imports (see the module doc)."""
    apps = [u for u in memq if u.app is not None]
    out = [f"# {line}" if line else "#" for line in header.splitlines()]
    out += ["accounts {", f"  {ACCOUNT}: {{", "    jetstream: enabled", "    users: ["]
    out += [_user(u, "      ") for u in memq if u.app is None]
    out += ["    ]"]
    if apps:
        out += ["    # each app's subjects, to that app's account alone", "    exports: ["]
        for u in apps:
            assert u.app is not None
            out += [_export(e, app_account(u.app), "      ") for e in app_exports(u.app)]
        out += ["    ]"]
    out += ["  }"]
    for u in apps:
        assert u.app is not None
        out += [f"  {_q(app_account(u.app))}: {{", "    users: [", _user(u, "      "), "    ]", "    imports: ["]
        out += [_import(e, "      ") for e in app_exports(u.app)]
        out += ["    ]", "  }"]
    out += [f"  {SYSTEM_ACCOUNT}: {{", "    users: ["]
    out += [_user(u, "      ") for u in system]
    out += ["    ]", "  }", "}", f"system_account: {SYSTEM_ACCOUNT}", ""]
    return "\n".join(out)


def credentials_document(
    memq: Sequence[User], system: Sequence[User], plain: Mapping[str, str], hashed: Mapping[str, str]
) -> dict:
    """The secrets file of ``memq nats accounts``: what each user needs to
    connect, and ``server_env``, the variables an ``--env-passwords`` config
    reads (bcrypt hashes, quoted: nats-server parses a variable's value as
    config, where a bare ``$2b$…`` would be another variable). ``account``
    at the top is the one with JetStream; each user's says where it is."""
    users = {}
    for u in [*memq, *system]:
        entry: dict = {
            "user": u.name,
            "password": plain[u.name],
            "env": {"MEMQ_NATS__USER": u.name, "MEMQ_NATS__PASSWORD": plain[u.name]},
        }
        entry["account"] = ACCOUNT if u.app is None else app_account(u.app)
        if u in system:
            entry["account"] = SYSTEM_ACCOUNT
        if u.app is not None:
            entry["app"] = u.app
            entry["inbox_prefix"] = app_inbox_prefix(u.app)
            entry["env"]["MEMQ_NATS__INBOX_PREFIX"] = app_inbox_prefix(u.app)
        users[u.name] = entry
    server_env = {env_var(u.name): json.dumps(hashed[u.name]) for u in [*memq, *system]}
    return {"account": ACCOUNT, "users": users, "server_env": server_env}


def generate_passwords(names: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain passwords, bcrypt hashes) for ``names``: 32 random bytes each."""
    import secrets

    import bcrypt

    plain = {n: secrets.token_urlsafe(32) for n in names}
    hashed = {n: bcrypt.hashpw(p.encode(), bcrypt.gensalt(BCRYPT_COST)).decode() for n, p in plain.items()}
    return plain, hashed


def reused_passwords(doc: Mapping, names: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain passwords, bcrypt hashes) of those of ``names`` that a previous
    secrets file ``doc`` holds: an upgraded config keeps every client's password.

    :raises ValueError: ``doc`` is not a secrets file of this command.
    """
    try:
        users, server_env = doc["users"], doc["server_env"]
        plain = {n: users[n]["password"] for n in names if n in users}
        hashed = {n: json.loads(server_env[env_var(n)]) for n in plain}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a `memq nats accounts` secrets file ({exc!r})") from None
    return plain, hashed


def user_names(apps: Sequence[str], *, admin: bool = True, system_user: bool = True) -> list[str]:
    return (
        [WORKERS]
        + ([ADMIN] if admin else [])
        + [app_user_name(a) for a in apps]
        + ([SYSTEM_USER] if system_user else [])
    )
