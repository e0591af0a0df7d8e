"""The HTTP gateway kind (``memq worker http``, part of ``memq up``): the REST
API of :mod:`.api` served by uvicorn inside the worker process, on the
process's NATS connection (or each app's own: :mod:`.clients`).

Why plain FastAPI and not FastStream's FastAPI integration
(``faststream.nats.fastapi.NatsRouter``): that router brings a broker of its
own, one connection with one NATS identity, and its lifespan connects it.
The gateway needs one identity *per app* (an app's key must reach NATS as
that app's user, so NATS itself fences it), the process already has its
broker and lifecycle (:mod:`memq.workers.runtime.app`), and the routes want
:class:`~memq.contracts.client.MemoryClient` (typed errors, pages, the
publish path of every other client) rather than bare ``broker.request``
calls. So the component keeps the lifecycle of every kind (open, start,
stop) and serves the FastAPI app with a uvicorn ``Server`` on a socket it
binds itself: a taken port fails the start with a clear error instead of
uvicorn's ``sys.exit``, and port 0 picks a free one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn
from nats.aio.client import Client as NATS

from memq.workers.http.api import build_api
from memq.workers.http.clients import AppClients
from memq.workers.http.door import BodyLimits
from memq.workers.http.keys import Keyring, check_open_is_local
from memq.workers.http.uvicorn_server import deadline_protocol
from memq.workers.redact import Redactor
from memq.workers.runtime import readiness
from memq.workers.runtime.component import Component, Live
from memq.workers.settings import Settings

if TYPE_CHECKING:
    from memq.workers.runtime.readiness import Check
    from memq.workers.runtime.resources import Resources

log = logging.getLogger("memq.http")

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5  # requests still open then are cut: the process is stopping


class HttpPortTaken(OSError):
    """The gateway's port is taken (another program, another `memq up`)."""


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the process owns SIGINT/SIGTERM
    and stops every component, this one included, in order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port).

    :raises HttpPortTaken: the port is in use, saying how to pick another.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise HttpPortTaken(
            f"the HTTP gateway cannot listen on {host}:{port} ({exc.strerror or exc}): another program listens "
            "there; pick another port with MEMQ_HTTP__PORT (0: any free port)"
        ) from None
    # Accepted sockets inherit it (Linux): without it uvicorn's response,
    # written in two parts, waited out Nagle and the client's delayed ACK,
    # ~40 ms a request (measured with tests/bench/gateway.py: 44 ms -> <1 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@dataclass
class GatewayLive(Live):
    """What a running gateway uses: a client per app (:mod:`.clients`)."""

    clients: AppClients


class HttpGateway(Component[GatewayLive]):
    """The http component of a worker process (:mod:`memq.workers.runtime.app`)."""

    KIND = "http"
    DESCRIPTION = "memq: the HTTP gateway"

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.keyring = Keyring.from_settings(settings.http)
        check_open_is_local(self.keyring, settings.http.host)  # before anything starts
        self.url: str | None = None  # once serving
        self._server: _Server | None = None
        self._serving: asyncio.Task | None = None

    # No router of its own: the gateway only sends (requests and publishes).

    async def build(self, nc: NATS, resources: Resources) -> GatewayLive:
        clients = AppClients(self.settings, nc)
        await clients.open()
        return GatewayLive(nc, nc.jetstream(), clients)

    def checks(self) -> dict[str, Check]:
        return {**super().checks(), "http": readiness.present(lambda: self.url, "the HTTP gateway is not serving")}

    def service_options(self) -> dict:
        # `memq status` shows where the gateway serves.
        return {"metadata": {"url": self.url or ""}}

    async def run(self) -> None:
        http = self.settings.http
        api = build_api(
            self.keyring,
            self.live.clients.get,
            limits=BodyLimits.from_settings(http),
            redact=Redactor.for_settings(self.settings),
            key_inflight=http.key_inflight,
        )
        sock = bind(http.host, http.port)
        config = uvicorn.Config(
            api,
            http=deadline_protocol(http.read_timeout_s),  # uvicorn's own, with a deadline for each request
            lifespan="off",  # the process's lifecycle opens and closes what the routes use
            log_config=None,  # keep memq's logging as it is
            access_log=False,
            timeout_graceful_shutdown=STOP_TIMEOUT_S,
        )
        self._server = _Server(config)
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]), name="http gateway")
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not self._server.started:
            if self._serving.done():
                self._serving.result()  # raises why it stopped
                raise RuntimeError("the HTTP gateway stopped while starting")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the HTTP gateway did not start within {START_TIMEOUT_S:g}s")
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        self._write_url_file()
        log.info("HTTP gateway on %s (%s)", self.url, "open: no API keys" if self.keyring.open else "API keys")

    def _write_url_file(self) -> None:
        # Beside nats.url: what `memq up`'s users (and tests) read to find the gateway.
        run_dir = self.settings.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "http.url").write_text(self.url or "")

    async def halt(self) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(self._serving, STOP_TIMEOUT_S + 2)
            except Exception:
                log.exception("the HTTP gateway did not stop cleanly")
            with contextlib.suppress(OSError):
                (self.settings.run_dir / "http.url").unlink()
        self._server = self._serving = None
        if self._live is not None:
            await self._live.clients.close()
