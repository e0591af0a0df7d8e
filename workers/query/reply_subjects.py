"""Which reply subjects the query worker answers on.

NATS checks a request's subject against the requester's permissions, never
its reply subject, and the query worker's user may publish to any reply
(``allow_responses``). Inside one account, a request on an app's own subject
with a reply of ``memq.v1.ev.<other app>…``, ``$KV.MEMQ_LEASES.…``,
``memq.v1.dlq.…`` or another app's ``_INBOX_<app>.…`` would make the worker
write there. With ``memq nats accounts``' config an app cannot do that (its
requests come through a service import, and the server replaces the reply);
this check is the defence that holds regardless, e.g. on a config from
before accounts. A reply is answered when it is under:

- ``_INBOX_<app token>.``: the requesting app's own inbox
  (:func:`memq.contracts.client.app_inbox_prefix`), which app users and the
  gateway's per-app connections use;
- ``_R_.``: a reply the server made for a request through a service import
  (every app request with the accounts config). No client can choose it:
  nats-server refuses a publish whose reply is under ``_R_.``;
- one of ``query.trusted_inboxes`` (default: this process's own
  ``nats.inbox_prefix``, or nats-py's ``_INBOX``): the inbox of memq's own
  connections in memq's account: the CLI, ``admin``, the gateway's shared
  connection, and every client of a server without auth (``memq up``). With
  accounts no app can name it; in a one-account config with app users an app
  could aim a reply at the workers' own inboxes there, so set it to ``[]``
  (or upgrade the config: docs/operations/security.md).

Anything else is dropped unanswered (an honest client never sends it), counted
in ``memq_query_replies_refused_total`` and logged at most once a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from memq.contracts.client import app_inbox_prefix
from memq.contracts.errors import InvalidId
from memq.contracts.ids import decode_token
from memq.workers import metrics

log = logging.getLogger("memq.query")

SERVICE_IMPORT_REPLY = "_R_."  # nats-server's prefix for replies mapped back through a service import
DEFAULT_INBOX = "_INBOX"  # nats-py's
LOG_EVERY_S = 60.0


def trusted_prefixes(trusted: Sequence[str] | None, own_inbox: str | None) -> tuple[str, ...]:
    """``query.trusted_inboxes`` as subject prefixes (each ending in a dot, so
    ``_INBOX`` never admits ``_INBOX_other``); None: this process's inbox."""
    names = [own_inbox or DEFAULT_INBOX] if trusted is None else list(trusted)
    return tuple(n.rstrip(".") + "." for n in names if n.rstrip("."))


class ReplyFence:
    """Decides, counts and logs (see the module doc)."""

    def __init__(self, trusted: Sequence[str]):
        self.trusted = (SERVICE_IMPORT_REPLY, *trusted)
        self._refused = 0  # since the last log line
        self._logged_at: float | None = None

    def allows(self, subject: str, reply: str) -> bool:
        """``reply`` is where a request on ``subject`` (``memq.v1.q.<app>.<op>``) may be answered."""
        if not reply:
            return False  # nothing to answer (a publish without a reply)
        if reply.startswith(self.trusted):
            return True
        parts = subject.split(".")
        try:
            app = decode_token(parts[3], "app") if len(parts) > 3 else None
        except InvalidId:
            return False
        return app is not None and reply.startswith(app_inbox_prefix(app) + ".")

    def refused(self, op: str, subject: str, reply: str) -> None:
        metrics.QUERY_REPLIES_REFUSED.labels(op).inc()
        self._refused += 1
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY_S:
            return
        since = "" if self._logged_at is None else f" ({self._refused} in the last {now - self._logged_at:.0f}s)"
        # ascii(): the reply is the requester's text, kept to one log line
        log.warning(
            "dropped a request on %s: its reply subject %s is not the app's inbox%s", subject, ascii(reply[:200]), since
        )
        self._refused, self._logged_at = 0, now
