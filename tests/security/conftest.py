"""A stack as an operator deploys it for several tenants: a real nats-server
with the config `memq nats accounts --app <A> --app <B>` writes, and the
persistence, query and summarizer workers as the ``workers`` user. The
attacks run as app A with only A's own credentials (``Tenants.app``).

Each app has a stream of its own (``streams.apps``), as
``memq nats accounts`` tells an operator to configure: C's with a small quota.

The stack is shared by the package's tests (starting it costs seconds); each
test uses sessions of its own. ``Tenants.stored`` and ``Tenants.dead_letters``
read the stream as ``admin``, the operator.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from helpers import make_settings, running
from nats.aio.client import Client as NATS
from pydantic import SecretStr
from services import NatsServer
from services import running as running_service

from memq.contracts.client import MemoryClient, app_inbox_prefix
from memq.contracts.ids import decode_token
from memq.workers import security
from memq.workers.persistence.worker import PersistenceWorker
from memq.workers.query.worker import QueryWorker
from memq.workers.runtime.event_streams import stream_of
from memq.workers.settings import AppStreamSettings, Settings
from memq.workers.summarizer.worker import SummarizerWorker

A, B = "app-a", "team.b"  # B's id is escaped in subjects, as real ids often are
C = "app-c"  # a third tenant, with a small quota: the one that fills its stream
C_QUOTA = 2 * 1024 * 1024  # bytes
SUMMARY_BUDGET = 150  # tokens: a dozen short turns put a session over its threshold


@dataclass
class Tenants:
    server: NatsServer
    passwords: dict[str, str]
    settings: Settings
    admin: NATS

    async def connect(self, user: str, **options) -> NATS:
        return await nats.connect(
            self.server.url, user=user, password=self.passwords[user], max_reconnect_attempts=0, **options
        )

    async def app(self, app: str) -> NATS:
        """A connection as ``app``'s own user, as an agent connects."""
        return await self.connect(security.app_user_name(app), inbox_prefix=app_inbox_prefix(app))

    async def client(self, app: str, **options) -> MemoryClient:
        user = security.app_user_name(app)
        return await MemoryClient.connect(
            self.server.url, app=app, user=user, password=self.passwords[user], max_reconnect_attempts=0, **options
        )

    async def stored(self, subject: str) -> int:
        """Messages in the events stream on ``subject`` (a filter)."""
        app = decode_token(subject.split(".")[3], "app")  # memq.v1.ev.<app>.…, perhaps a wildcard after it
        stream = stream_of(self.settings.streams, app)
        info = await self.admin.jetstream().stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())

    async def dead_letters(self) -> int:
        return (await self.admin.jetstream().stream_info(self.settings.streams.dlq)).state.messages


@asynccontextmanager
async def tenant_stack(tmp: Path, *, own_streams: bool = True) -> AsyncIterator[Tenants]:
    """The stack; ``own_streams`` False keeps every app on the one shared
    stream (the default deployment), where the fences that per-app streams
    make moot (a shared duplicate window) must hold by themselves."""
    names = security.user_names([A, B, C])
    passwords, hashed = security.generate_passwords(names)
    memq_users, system_users = security.build_users([A, B, C], hashed)
    config = security.render_accounts(memq_users, system_users)
    with running_service(functools.partial(NatsServer, config=config)) as server:
        s = make_settings(server.url, f"sqlite+aiosqlite:///{tmp}/memq.db", tmp)
        s.nats = s.nats.model_copy(update={"user": security.WORKERS, "password": SecretStr(passwords["workers"])})
        if own_streams:
            apps = {A: AppStreamSettings(), B: AppStreamSettings(), C: AppStreamSettings(max_bytes=C_QUOTA)}
            s.streams = s.streams.model_copy(update={"apps": apps})
        s.summarizer = s.summarizer.model_copy(update={"sweep_interval_s": 0.5, "retry_after_s": 0.5})
        budget = {"strategy": "summary_buffer", "budget": SUMMARY_BUDGET}
        s.query = s.query.model_copy(update={"apps": {A: budget, B: budget}})
        async with AsyncExitStack() as stack:
            for worker in (PersistenceWorker(s), QueryWorker(s), SummarizerWorker(s)):
                await stack.enter_async_context(running(worker))
            admin = await nats.connect(server.url, user=security.ADMIN, password=passwords["admin"])
            stack.push_async_callback(admin.close)
            yield Tenants(server, passwords, s, admin)


@pytest.fixture(scope="package")
async def tenants(tmp_path_factory) -> AsyncIterator[Tenants]:
    async with tenant_stack(tmp_path_factory.mktemp("tenants")) as stack:
        yield stack


@pytest.fixture(scope="package")
async def one_stream_tenants(tmp_path_factory) -> AsyncIterator[Tenants]:
    """The same tenants on the one shared events stream."""
    async with tenant_stack(tmp_path_factory.mktemp("one-stream"), own_streams=False) as stack:
        yield stack
