"""uvicorn as the gateway and ``memq mcp --transport http`` run it: with a
deadline for reading each request (``http.read_timeout_s``).

uvicorn has no timeout on receiving a request. ``timeout_keep_alive`` runs
only between requests and is cancelled by every byte received, and nothing
starts before a connection's first request, so a client that sends its
headers (or its body) a byte at a time, or nothing at all, holds the
connection for as long as it likes (slow-loris), and so does one that keeps
trickling the body of a request already refused. An ASGI middleware cannot
help: it runs once the headers are in, and cannot close the connection. So
:func:`deadline_protocol` subclasses uvicorn's own HTTP protocol (the one its
``http="auto"`` picks) with one timer: armed when a request begins (the
connection opens, or the first byte after a request was read whole), it
closes the connection unless the request's headers and body have all
arrived in time. It is disarmed as soon as they have, so a slow answer (a
read waiting for its ``min_seq``) is never cut. A refused request whose body
the app never read stays armed: uvicorn discards that body as it comes, for
at most the deadline. The gateway's 408 has no body; ``memq mcp --transport
http`` has :func:`deadline_protocol` render one (a JSON-RPC error).
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

from starlette.responses import Response
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from memq.workers.http.door import Render

log = logging.getLogger("memq.http")

# What a client that never finished its request is told before the close.
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def timed_out_message(read_timeout_s: float) -> str:
    return f"the request did not arrive whole within {read_timeout_s:g}s (http.read_timeout_s): send it at once"


def raw_answer(response: Response) -> bytes:
    """``response`` as the bytes the protocol writes itself (it is no ASGI app's
    answer: the app never got the request), the connection then closed."""
    status = HTTPStatus(response.status_code)
    lines = [f"HTTP/1.1 {status.value} {status.phrase}".encode()]
    lines += [name + b": " + value for name, value in response.raw_headers if name != b"connection"]
    return b"\r\n".join([*lines, b"connection: close", b"", response.body])


class _ReadDeadline:
    """The timer of the module doc, over uvicorn's protocol (h11 or httptools:
    both keep the request being answered in ``self.cycle``, whose
    ``more_body`` turns false once its body has all arrived)."""

    read_timeout_s: float
    timed_out: bytes  # what a request that did not arrive in time is answered
    # uvicorn's protocol's, named for the type checker
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._deadline: asyncio.TimerHandle | None = None
        self._before: object = None  # the request that was current when this one began
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:  # the first byte of a new request
            self._arm()
        super().data_received(data)  # type: ignore[misc]
        self._disarm_if_read()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm_if_read()  # a pipelined request, parsed from what was buffered

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._before = self.cycle
        self._deadline = self.loop.call_later(self.read_timeout_s, self._expired)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _disarm_if_read(self) -> None:
        cycle = self.cycle
        if self._deadline is not None and cycle is not None and cycle is not self._before and not cycle.more_body:
            self._cancel()

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or upgraded
            return
        cycle = self.cycle
        if cycle is None or cycle is self._before or not cycle.response_started:
            self.transport.write(self.timed_out)  # nothing answered yet: say why it ends
        log.debug(
            "closed the connection of %s: its request did not arrive within %gs (http.read_timeout_s)",
            self.client,
            self.read_timeout_s,
        )
        self.transport.close()


def deadline_protocol(read_timeout_s: float, render: Render | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the read deadline, for
    ``uvicorn.Config(http=…)``; its 408 has no body, or the one ``render``
    gives it (``timed_out``, naming the setting)."""
    if render is None:
        answer = TIMED_OUT
    else:
        answer = raw_answer(render(408, "timed_out", timed_out_message(read_timeout_s), None))
    attrs = {"read_timeout_s": float(read_timeout_s), "timed_out": answer}
    return type("DeadlineHTTPProtocol", (_ReadDeadline, AutoHTTPProtocol), attrs)
