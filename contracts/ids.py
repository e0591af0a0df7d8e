"""Id validation and the reversible encoding of ids into NATS subject tokens.

Any UTF-8 string of 1..256 bytes is a valid id. NATS subject tokens cannot hold
``.``, ``*``, ``>`` or whitespace, so ids are escaped: the characters
``[A-Za-z0-9_-]`` stand for themselves and every other byte of the UTF-8 form
becomes ``~XX`` (two upper-case hex digits). ``~`` is escaped too, which makes
the mapping a bijection; plain ids stay readable in subjects and monitoring.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from memq.contracts.errors import InvalidId

MAX_ID_BYTES = 256

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_TOKEN_RE = re.compile(r"^(?:[A-Za-z0-9_-]|~[0-9A-F]{2})+$")
# The same set as _SAFE, for a whole id at once: a per-byte check in Python
# cost microseconds on every publish and every decoded message.
_PLAIN_RE = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def validate_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is a usable id, else raise :class:`InvalidId`."""
    if not isinstance(value, str):
        raise InvalidId(f"{what} must be a string, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidId(f"{what} is not valid UTF-8: {exc.reason}") from None
    if not raw:
        raise InvalidId(f"{what} must not be empty")
    if len(raw) > MAX_ID_BYTES:
        raise InvalidId(f"{what} is {len(raw)} bytes; the limit is {MAX_ID_BYTES}")
    return value


def encode_token(value: str, what: str = "id") -> str:
    """Encode a valid id as one NATS subject token (reversible)."""
    if _PLAIN_RE.fullmatch(validate_id(value, what)):
        return value
    raw = value.encode("utf-8")
    return "".join(chr(b) if b in _SAFE else f"~{b:02X}" for b in raw)


def decode_token(token: str, what: str = "token") -> str:
    """Invert :func:`encode_token`; raise :class:`InvalidId` on a malformed token."""
    if not _TOKEN_RE.fullmatch(token):  # fullmatch: "$" would allow a trailing newline
        raise InvalidId(f"{what} {token!r} is not an encoded id")
    if "~" not in token:
        return validate_id(token, what)  # still at most 256 bytes
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "~":
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(token[i]))
            i += 1
    try:
        value = out.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidId(f"{what} {token!r} does not decode to UTF-8") from None
    # Only the canonical token is accepted (not "~41" for "A"): an id has one
    # subject, so subject permissions and per-subject purges cannot be bypassed.
    if encode_token(value, what) != token:
        raise InvalidId(f"{what} {token!r} is not the canonical encoding of {value!r}")
    return value


@lru_cache(maxsize=65536)  # hot: every message of a batch asks, for few scopes
def scope_key(*ids: str) -> str:
    """A fixed-length key for a tuple of ids (e.g. app, user, session).

    SQL tables key rows by this digest instead of three 256-byte columns, which
    would exceed MySQL's 3072-byte index limit. Tokens never contain ``.``, so
    joining them with ``.`` is unambiguous.
    """
    joined = ".".join(encode_token(i) for i in ids)
    return hashlib.sha256(joined.encode("ascii")).hexdigest()
