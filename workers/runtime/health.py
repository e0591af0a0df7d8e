"""One small HTTP server per process: ``GET /metrics``, ``/healthz``, ``/readyz``.

Served only when ``metrics.port`` is set (``MEMQ_METRICS__PORT``), so
replicas on one host do not clash by default.

- ``/metrics``: the registry of :mod:`memq.workers.metrics`, by prometheus_client's
  own WSGI app.
- ``/healthz`` (liveness): 200 while the process's asyncio loop runs; a
  heartbeat the loop stamps every second or so, 503 once it is older than
  ``metrics.liveness_timeout_s`` (a blocked or dead loop: restart the process).
- ``/readyz`` (readiness): 200 when every worker kind of the process has
  started and each of its checks passes; else 503 with a JSON body naming the
  failed checks. Checks, run by the loop every ``metrics.refresh_s`` (each
  bounded by ``metrics.check_timeout_s``), are those each component declares
  (``Component.checks()``, built from :mod:`memq.workers.runtime.readiness`):

  ============ ===========================================================
  persistence  ``nats`` connected, ``consumer`` fetching, ``database`` answers ``SELECT 1``
  indexing     ``nats`` connected, ``index`` prepared and answering, ``consumer`` fetching
  summarizer   ``nats`` connected, ``database`` answers ``SELECT 1``
  query        ``nats`` connected, ``service`` registered, ``database`` answers ``SELECT 1``
  http         ``nats`` connected, ``http`` serving
  ============ ===========================================================

  The Redis cache is not a readiness check: without it, queries are answered
  from SQL.

Why a threaded WSGI server (wsgiref, what prometheus_client's own
``start_http_server`` runs) rather than the ASGI app in the worker's loop:
probes and scrapes must be answered even when the loop is blocked, which is
when liveness has to say 503 and when metrics are wanted most; and it needs
no ASGI server. The HTTP threads only read state that the loop writes (a
timestamp and a dict swapped whole), so they never touch asyncio objects.

The same refresh re-reads the gauges that come from JetStream: each worker's
own durable consumer (lag, ack pending, redeliveries, ack floor) and the
DLQ depth per worker.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import orjson
from nats.js.errors import NotFoundError
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from memq.contracts.subjects import dlq_subject
from memq.workers import metrics
from memq.workers.runtime.component import Component, Live
from memq.workers.runtime.event_streams import event_streams
from memq.workers.runtime.kinds import KINDS
from memq.workers.runtime.readiness import Check, NotReady
from memq.workers.settings import MetricsSettings, Settings

log = logging.getLogger("memq.health")


# --- what the HTTP threads read ---------------------------------------------


class HealthState:
    """Liveness and readiness as last seen by the loop. Written by the loop,
    read by the HTTP threads (plain attributes, each replaced whole)."""

    def __init__(self, liveness_timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.liveness_timeout_s = liveness_timeout_s
        self.clock = clock
        self.beat = clock()
        self.expected: tuple[str, ...] = ()  # worker kinds this process runs
        # "<kind>.<check>" -> None (passes) or why it fails; a kind is in it
        # once it has started and its checks have run.
        self.results: dict[str, str | None] = {}
        self.stopping = False  # the workers are shutting down

    def stamp(self) -> None:
        self.beat = self.clock()

    def liveness(self) -> tuple[int, dict[str, Any]]:
        age = self.clock() - self.beat
        if age > self.liveness_timeout_s:
            return 503, {"status": "stalled", "loop_age_s": round(age, 3), "limit_s": self.liveness_timeout_s}
        return 200, {"status": "ok", "loop_age_s": round(age, 3)}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        results = self.results  # one read: the loop swaps the dict whole
        checked = {name.split(".", 1)[0] for name in results}
        checks: dict[str, str] = {kind: "starting" for kind in self.expected if kind not in checked}
        live, body = self.liveness()
        if live != 200:
            checks["loop"] = f"the event loop has not run for {body['loop_age_s']}s"
        checks.update({name: why or "ok" for name, why in results.items()})
        if self.stopping:
            checks["process"] = "stopping"
        failed = {name: why for name, why in checks.items() if why != "ok"}
        if failed or not self.expected:
            return 503, {"status": "not ready", "failed": failed or {"process": "no worker"}, "checks": checks}
        return 200, {"status": "ready", "checks": checks}


def make_app(state: HealthState, registry=metrics.REGISTRY) -> Callable:
    """The WSGI app: /metrics, /healthz, /readyz (GET); anything else is 404."""
    metrics_app = make_wsgi_app(registry)
    reasons = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}

    def app(environ, start_response):
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, body = 405, {"error": "use GET"}
        elif path == "/healthz":
            status, body = state.liveness()
        elif path == "/readyz":
            status, body = state.readiness()
        else:
            status, body = 404, {"error": "no such path; try /metrics, /healthz or /readyz"}
        start_response(
            f"{status} {reasons[status]}", [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
        )
        return [orjson.dumps(body)]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a probe every few seconds: not worth a log line
        pass


class HttpServer:
    """The WSGI app on ``host:port`` (0: any free port) in a daemon thread."""

    def __init__(self, app: Callable, host: str, port: int):
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class MemqHttpServer(ThreadingWSGIServer):  # listens on the host's own family (IPv4 or IPv6)
            address_family = family

        self.httpd = make_server(host, port, app, MemqHttpServer, handler_class=_QuietHandler)
        self.host = host
        self.port = self.httpd.server_port
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="memq-metrics-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()  # waits for serve_forever's loop (polls every 0.5 s)
        self.httpd.server_close()


# --- readiness checks and durables, from the registry of kinds ----------------


def durable_of(kind: str, settings: Settings) -> str | None:
    """The durable consumer a worker kind reads the stream with, if any."""
    return KINDS[kind].durable(settings)


def _why(exc: BaseException) -> str:
    text = str(exc).split("\n", 1)[0]  # SQLAlchemy appends the statement and a link
    return f"{type(exc).__name__}: {text}"[:300] if not isinstance(exc, NotReady) else text


# --- the loop side ------------------------------------------------------------


class Monitor:
    """Serves the HTTP endpoints and keeps them and the JetStream gauges fresh.

    Usage: ``await start(kinds)`` before the workers start (liveness answers
    during a slow start, readiness says "starting"), ``watch(kind, worker)``
    once each has started; ``await drain()`` before they stop (no more checks
    against closing connections, readiness says "stopping", liveness still
    answers) and ``await stop()`` after. Does nothing when ``metrics.port``
    is unset.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.config: MetricsSettings = settings.metrics
        self.state = HealthState(self.config.liveness_timeout_s)
        self.server: HttpServer | None = None
        self.workers: list[tuple[str, Component[Live]]] = []
        self._tasks: list[asyncio.Task] = []
        self._refresher: asyncio.Task | None = None
        self._wake = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return self.config.port is not None

    @property
    def url(self) -> str | None:
        return f"http://{self.server.host}:{self.server.port}" if self.server else None

    async def start(self, kinds: Iterable[str]) -> None:
        """Serve the endpoints. Raises OSError if the port cannot be bound."""
        port = self.config.port
        if port is None:  # metrics off (what `enabled` tests; spelled so the type narrows)
            return
        self.state.expected = tuple(kinds)
        self.state.stamp()
        self.server = HttpServer(make_app(self.state), self.config.host, port)
        self._refresher = asyncio.create_task(self._refresh_forever(), name="memq health refresh")
        self._tasks = [asyncio.create_task(self._beat_forever(), name="memq health heartbeat"), self._refresher]
        log.info("metrics and health on %s (/metrics, /healthz, /readyz)", self.url)

    def watch(self, kind: str, worker: Component[Live]) -> None:
        """Check ``worker`` (started) from now on, and refresh at once."""
        if not self.enabled:
            return
        self.workers.append((kind, worker))
        self._wake.set()

    async def drain(self) -> None:
        """Stop checking the workers (they are about to stop); keep serving."""
        self.state.stopping = True
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.server is not None:
            await asyncio.to_thread(self.server.close)
            self.server = None

    # --- periodic work ------------------------------------------------------

    async def _beat_forever(self) -> None:
        every = min(1.0, self.config.liveness_timeout_s / 4)
        while True:
            self.state.stamp()
            await asyncio.sleep(every)

    async def _refresh_forever(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.refresh()
            except Exception:  # a bug here must not end the refreshes
                log.exception("health refresh failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.refresh_s)
            except TimeoutError:
                pass

    async def refresh(self) -> None:
        """Run every check and re-read the JetStream gauges, once."""
        named = [(f"{kind}.{name}", check) for kind, w in self.workers for name, check in w.checks().items()]
        outcomes = await asyncio.gather(*(self._run(check) for _, check in named))
        results = dict(zip((name for name, _ in named), outcomes, strict=True))
        for name, why in results.items():
            metrics.READY.labels(name).set(0 if why else 1)
        failed = {n: w for n, w in results.items() if w}
        if failed and failed != {n: w for n, w in self.state.results.items() if w}:
            log.warning("not ready: %s", "; ".join(f"{n}: {w}" for n, w in failed.items()))
        self.state.results = results
        await self._refresh_gauges()

    async def _run(self, check: Check) -> str | None:
        try:
            await asyncio.wait_for(check(), self.config.check_timeout_s)
            return None
        except TimeoutError:
            return f"no answer within {self.config.check_timeout_s}s"
        except Exception as exc:
            return _why(exc)

    async def _refresh_gauges(self) -> None:
        streams = self.settings.streams
        connected = [(k, w.nc) for k, w in self.workers if w.nc is not None and w.nc.is_connected]
        for kind, nc in connected:
            durable = durable_of(kind, self.settings)
            if durable is None:
                continue
            for stream in event_streams(streams):
                try:
                    info = await asyncio.wait_for(
                        nc.jetstream().consumer_info(stream, durable), self.config.check_timeout_s
                    )
                except NotFoundError:  # not created yet (indexing prepares its index first)
                    continue
                except Exception as exc:  # NATS going away: keep the last values
                    log.debug("consumer info of %s on %s failed: %s", durable, stream, exc)
                    continue
                metrics.set_consumer(
                    durable,
                    stream,
                    info.num_pending or 0,
                    info.num_ack_pending or 0,
                    info.num_redelivered or 0,
                    info.ack_floor.stream_seq if info.ack_floor else 0,
                )
        if connected:  # any connection will do: the DLQ is one stream
            js = connected[0][1].jetstream()
            try:
                info = js.stream_info(streams.dlq, subjects_filter=">")
                dlq = await asyncio.wait_for(info, self.config.check_timeout_s)
            except Exception as exc:
                log.debug("stream info of %s failed: %s", streams.dlq, exc)
                return
            metrics.set_dlq(metrics.dlq_depth_by_worker(dict(dlq.state.subjects or {}), dlq_subject("")))
