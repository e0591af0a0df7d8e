"""The NATS side of the gateway: one :class:`~memq.contracts.client.MemoryClient`
per app, each bound to its app (every subject it uses carries it).

Where the app's own NATS user is known (``http.apps.<app>.nats_password``, or
its entry in the secrets file of ``memq nats accounts``, ``http.accounts_file``),
the app's client has a connection of its own, as that user with the app's
inbox prefix: NATS itself then refuses anything of another app's, whatever
the gateway does. Otherwise (the embedded default, whose nats-server has no
auth) the clients share the worker process's connection.

Reads are not read-your-writes by default (``consistent=False``): HTTP is
stateless, so a client's last publish means nothing to the next request.
Each write answers with its stream sequence, and a read given ``min_seq``
waits for it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from memq.contracts.client import MemoryClient, app_inbox_prefix
from memq.workers.runtime import bus
from memq.workers.security import app_user_name
from memq.workers.settings import HttpAppSettings, Settings

log = logging.getLogger("memq.http")


def _accounts(path: Path) -> dict[str, dict[str, Any]]:
    """app -> its user entry in a ``memq nats accounts`` secrets file."""
    try:
        users = json.loads(path.read_text())["users"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"http.accounts_file {path}: not a `memq nats accounts` secrets file ({exc})") from None
    return {entry["app"]: entry for entry in users.values() if isinstance(entry, dict) and "app" in entry}


def nats_credentials(settings: Settings) -> dict[str, tuple[str, str]]:
    """app -> (NATS user, password) for the apps whose own user is known.

    :raises ValueError: an accounts file is set but lacks one of the apps.
    """
    http = settings.http
    accounts = _accounts(http.accounts_file) if http.accounts_file is not None else None
    found: dict[str, tuple[str, str]] = {}
    for app, entry in http.apps.items():
        if entry.nats_password is not None:
            found[app] = (entry.nats_user or app_user_name(app), entry.nats_password.get_secret_value())
        elif accounts is not None:
            if app not in accounts:
                raise ValueError(
                    f"app {app!r} has an API key but no user in {http.accounts_file}: "
                    f"run `memq nats accounts` with --app {app}"
                )
            found[app] = (accounts[app]["user"], accounts[app]["password"])
    return found


class AppClients:
    """The client each app's requests use (see the module doc)."""

    def __init__(self, settings: Settings, nc: NATS, kind: str = "http"):
        self.settings = settings
        self.nc = nc
        self.kind = kind  # names the app's connections (<kind>-<app>): `memq status` and /connz tell servers apart
        self._clients: dict[str, MemoryClient] = {}
        self._owned: list[MemoryClient] = []

    async def open(self, only: str | None = None) -> None:
        """Connect each app that has a NATS user of its own (``only``: just
        that app, as `memq mcp` serves one)."""
        credentials = nats_credentials(self.settings)
        for app, entry in self.settings.http.apps.items():
            if only is not None and app != only:
                continue
            if app in credentials:
                client = await self._connect(app, entry, *credentials[app])
                self._owned.append(client)
            else:
                client = MemoryClient(self.nc, app, consistent=False, consistency="any")
            self._clients[app] = client
        if self._owned:
            log.info("HTTP gateway: %d apps on their own NATS users", len(self._owned))

    async def _connect(self, app: str, entry: HttpAppSettings, user: str, password: str) -> MemoryClient:
        options = bus.connect_options(self.settings, f"{self.kind}-{app}")
        for inherited in ("user", "password", "token", "user_credentials"):  # the workers' identity: not this app's
            options.pop(inherited, None)
        servers = options.pop("servers")
        options.update(user=user, password=password, inbox_prefix=app_inbox_prefix(app))
        # Reads see every acknowledged write, as on the shared connection (get()).
        return await MemoryClient.connect(servers, app=app, consistent=False, consistency="any", **options)

    def get(self, app: str) -> MemoryClient:
        """The app's client. An app without a key of its own (an open
        gateway) gets a client on the shared connection, made per request
        (it is a few attributes: no connection, no I/O)."""
        client = self._clients.get(app)
        return client if client is not None else MemoryClient(self.nc, app, consistent=False, consistency="any")

    async def close(self) -> None:
        owned, self._owned, self._clients = self._owned, [], {}
        for client in owned:
            try:
                await client.close()
            except Exception:  # one failure must not leave the others open
                log.exception("closing app %r's NATS connection failed", client.app)
