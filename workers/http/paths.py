"""Every id the contract accepts, reachable in the gateway's paths.

An id is any UTF-8 of 1..256 bytes (:mod:`memq.contracts.ids`), so it may
hold ``/`` (sent as ``%2F``) or ``%`` (``%25``). The ASGI server decodes the
path before routing (``scope["path"]``; only ``raw_path`` keeps the bytes
as sent), so Starlette's router saw ``…/sessions/a%2Fb/history`` as
``…/sessions/a/b/history`` and answered 404. Starlette's own ``{x:path}``
converter takes the rest of the path, greedy: two ids that may both hold
``/`` (user and session) could not be told apart.

So, hand-written: :class:`RawSegments` rebuilds ``scope["path"]`` from
``raw_path`` one segment at a time, each decoded but with ``%`` and ``/``
escaped again (``%25``, ``%2F``): the path keeps the segments as sent, and
nothing else changes. The routes' id parameters take the :class:`IdSegment`
converter (``{user:id}``), which matches one segment and decodes those two
escapes, Starlette's own way of turning a path parameter into a value.
A client must percent-encode each id as one segment
(``urllib.parse.quote(id, safe="")``); ``.`` and ``..`` then arrive as
``%2E`` and ``%2E%2E``, which no client normalises away.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

ID = "id"  # the converter's name in a route's path: {user:id}


def routable(raw_path: bytes) -> str:
    """The path as the router should see it: each segment decoded, with ``%``
    and ``/`` inside a segment kept escaped (see the module doc)."""
    segments = raw_path.decode("latin-1").split("/")  # bytes as sent: ASCII, or %XX escapes
    return "/".join(unquote(s).replace("%", "%25").replace("/", "%2F") for s in segments)


def segment_id(segment: str) -> str:
    """An id from one segment of a path :func:`routable` made."""
    return segment.replace("%2F", "/").replace("%25", "%")


class IdSegment(Convertor[str]):
    """One path segment as an id: ``/`` and ``%`` come escaped (:func:`routable`)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return segment_id(value)

    def to_string(self, value: str) -> str:
        return value.replace("%", "%25").replace("/", "%2F")


register_url_convertor(ID, IdSegment())


class RawSegments:
    """ASGI middleware: ``scope["path"]`` from ``raw_path`` (:func:`routable`).
    Outermost, so every middleware and route sees segments as sent."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw: Any = scope.get("raw_path")
        if scope["type"] == "http" and isinstance(raw, bytes | bytearray) and raw:
            path = routable(bytes(raw).split(b"?", 1)[0])  # some servers leave the query on it
            root = scope.get("root_path", "")
            if root and not path.startswith(root):  # raw_path holds the root too (ASGI spec); keep it so
                path = root + path
            scope = {**scope, "path": path}
        await self.app(scope, receive, send)
