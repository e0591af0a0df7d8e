"""What an error message a client receives may say about the server: nothing
internal.

Errors are often built from exceptions, and an exception's text names what
the server knows: a file under the data directory, a database URL with its
password, the host of an internal service. Such a message is fine in the
server's log and wrong in a reply: it tells an outsider where things are
(a search error once carried the path of the embedded index).
:class:`Redactor` is applied where messages leave the server (the query
worker's error replies, the HTTP gateway's error responses); the code that
builds a message should still keep such detail out of it, this is the net.

It replaces the settings' own secrets, paths, URLs and their hosts wherever
they appear, then anything shaped like a URL, an absolute file path or an
IPv4 address.

Each message is scrubbed once: the redactor keeps the last
``MEMO`` messages it scrubbed with their results (a pure function of the
message). The query worker scrubs every error reply, and a flood of one
app's refusals is the same few messages over and over: scrubbing each anew
(a regex pass per configured value, 40-80 µs) was a sixth of the query
worker's time while one app's refused reads kept it busy.
Only short messages are kept (``MEMO_CHARS``), so the memo stays small.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

SERVER = "<server>"
SERVER_PATH = "<server path>"
MIN_LEN = 4  # shorter configured values ("db", "1") are too likely to be ordinary words
MEMO = 1024  # scrubbed messages remembered; a flood of distinct ones only empties it
MEMO_CHARS = 2000  # a longer message is scrubbed each time

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"()<>,;]+")
# Two or more segments from the root (or ~): "/srv/memq/index.db", not a lone "/" or "/v1".
_PATH = re.compile(r"(?<![\w.~/-])~?/(?:[\w.@+-]+/)+[\w.@+-]*|\b[A-Za-z]:\\[^\s'\"()<>,;]+")
_REST = r"(?:[/\\][^\s'\"()<>,;:]*)?"  # the rest of a path after a known directory
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")


class Redactor:
    """Scrubs messages of ``internals`` (exact strings) and of anything
    shaped like a URL, a path or an address.

    :param internals: strings to hide wherever they occur; those shorter
        than ``MIN_LEN`` are ignored.
    """

    def __init__(self, internals: Iterable[str] = ()):
        kept = sorted({s for s in internals if len(s) >= MIN_LEN}, key=len, reverse=True)
        # Longest first: a path before the directory it is in, a URL before its host.
        # A path takes what follows it in the path too (a file in the data directory).
        self._internals = [
            (re.compile(re.escape(s) + _REST), SERVER_PATH)
            if _looks_like_path(s)
            else (re.compile(re.escape(s)), SERVER)
            for s in kept
        ]
        self._memo: dict[str, str] = {}

    @classmethod
    def for_settings(cls, settings: BaseModel) -> Redactor:
        """A redactor of every secret, path and URL (and its host and password) in ``settings``."""
        return cls(internals(settings))

    def __call__(self, message: str) -> str:
        if len(message) > MEMO_CHARS:
            return self._scrub(message)
        scrubbed = self._memo.get(message)
        if scrubbed is None:
            if len(self._memo) >= MEMO:
                self._memo.clear()
            scrubbed = self._memo[message] = self._scrub(message)
        return scrubbed

    def _scrub(self, message: str) -> str:
        for pattern, placeholder in self._internals:
            message = pattern.sub(placeholder, message)
        message = _URL.sub(SERVER, message)
        message = _PATH.sub(SERVER_PATH, message)
        return _IPV4.sub(SERVER, message)


def internals(settings: BaseModel) -> set[str]:
    """The strings of ``settings`` a client must not see: secret values,
    paths (as given and absolute) and URLs with their hosts and passwords, found by
    walking the model, so a field added later is covered too."""
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                walk(v)
        elif isinstance(value, SecretStr):
            secret = value.get_secret_value()
            found.add(secret)
            found.update(_url_parts(secret))
        elif isinstance(value, Path):
            found.update({str(value), os.path.abspath(value)})
        elif isinstance(value, str) and "://" in value:
            found.add(value)
            found.update(_url_parts(value))

    walk(settings)
    return found


def _url_parts(text: str) -> set[str]:
    """The hosts and passwords of the URLs in ``text`` (a list of URLs,
    comma-separated, too)."""
    out: set[str] = set()
    for url in text.split(","):
        try:
            parts = urlsplit(url.strip())
            found = (parts.hostname, parts.password)
        except ValueError:  # not a URL after all
            continue
        out.update(p for p in found if p)
    return out


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", "~")) or bool(re.match(r"[A-Za-z]:\\", s))
