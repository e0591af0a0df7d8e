"""Which app an HTTP request may act for: its API key, checked (pure, no I/O).

Every app of ``http.apps`` has one key; a request names the app in its path
and must carry that app's key, so one app's key never reaches another app's
data (the gateway then talks to NATS as that app only: :mod:`.clients`).

With no keys configured the gateway is *open*: it needs no key and serves
any app named in the path. That is the embedded default of ``memq up``, and
it is only allowed on a loopback address (:func:`check_open_is_local`): the
embedded nats-server it fronts has no auth either and listens on loopback,
so anyone who can reach the open gateway can already reach every app's
subjects on NATS directly; a key would protect nothing. A request that
sends a key to an open gateway is refused (401) rather than served as if
the key had been checked.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

from memq.workers.settings import HttpSettings


class Unauthenticated(Exception):
    """No key, or a key this gateway does not know (401)."""


class WrongApp(Exception):
    """A valid key, of another app than the one the request names (403)."""


def _digest(key: str) -> bytes:
    # Looked up by digest: a dict lookup on the key itself would compare the
    # secret byte by byte with whatever shares its hash bucket.
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class Keyring:
    """API key digests -> app. Empty: an open gateway (see the module doc)."""

    apps_by_digest: dict[bytes, str]

    @classmethod
    def from_settings(cls, http: HttpSettings) -> Keyring:
        by_digest: dict[bytes, str] = {}
        for app, entry in http.apps.items():
            key = entry.api_key.get_secret_value()
            if not key:
                raise ValueError(f"http.apps[{app!r}].api_key is empty")
            if (other := by_digest.setdefault(_digest(key), app)) != app:
                raise ValueError(f"apps {other!r} and {app!r} have the same API key; give each app its own")
        return cls(by_digest)

    @property
    def open(self) -> bool:
        return not self.apps_by_digest

    def authenticate(self, key: str | None) -> str | None:
        """The app ``key`` is for (None when open: then no key is right).

        :raises Unauthenticated: no key, or an unknown one (or any key when open).
        """
        if self.open:
            if key is not None:
                raise Unauthenticated(
                    "this gateway has no API keys configured (http.apps), so it takes none: "
                    "send the request without an Authorization or X-API-Key header"
                )
            return None
        if not key:
            raise Unauthenticated("an API key is required: `Authorization: Bearer <key>` or `X-API-Key: <key>`")
        owner = self.apps_by_digest.get(_digest(key))
        if owner is None:
            raise Unauthenticated("unknown API key")
        return owner

    def authorize(self, app: str, key: str | None) -> None:
        """Return if ``key`` may act for ``app``.

        :raises Unauthenticated: as :meth:`authenticate`.
        :raises WrongApp: the key is another app's.
        """
        owner = self.authenticate(key)
        if owner is not None and owner != app:
            raise WrongApp(f"this API key is not for app {app!r}")


def check_open_is_local(keyring: Keyring, host: str) -> None:
    """Refuse an open gateway on anything but a loopback address.

    :raises ValueError: with what to set instead.
    """
    if not keyring.open:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        loopback = False
    if not loopback:
        raise ValueError(
            f"the HTTP gateway would serve every app without a key on {host}: set an API key per app "
            '(MEMQ_HTTP__APPS=\'{"<app>": {"api_key": "…"}}\') or keep http.host on 127.0.0.1'
        )
