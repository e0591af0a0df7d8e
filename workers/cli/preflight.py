"""What `memq up` and `memq worker` check before anything starts: the ports
they will listen on, the data dir, and the packages the chosen settings need.

Each problem is one line saying what to change. Found here, a taken port or a
missing package stops the command in a fraction of a second; found by the
component that needs it, it stopped NATS and four started workers first and
ended in a long traceback.
"""

from __future__ import annotations

import importlib.util
import socket
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from memq.workers.runtime.embedded_nats import EmbeddedError, nats_server_binary, running_pid
from memq.workers.settings import Settings

INSTALL = "pip install 'memq[workers]'"
SQL_KINDS = frozenset({"persistence", "indexing", "summarizer", "query"})  # indexing: each turn's previous one
INDEX_KINDS = frozenset({"indexing", "query"})  # the query worker embeds and searches queries


def port_problem(what: str, host: str, port: int, change: str) -> str | None:
    """Why ``port`` on ``host`` cannot be listened on, or None (0: any free
    port, always fine). SO_REUSEADDR as the servers bind with it: a port whose
    last connections linger in TIME-WAIT is free, only a listener takes it."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return f"{what} cannot listen on {host}:{port} ({exc.strerror or exc}): {change}"
    return None


def data_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold memq's data (created if missing), or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return f"the data dir {path} is not usable ({reason}): fix its permissions, or set MEMQ_DATA_DIR"
    return None


def _driver(url: str) -> str | None:
    """The async driver package of a SQLAlchemy URL (``sqlite+aiosqlite`` -> aiosqlite)."""
    scheme = url.split("://", 1)[0]
    return scheme.split("+", 1)[1] if "+" in scheme else None


def needed_packages(settings: Settings, kinds: Iterable[str]) -> dict[str, str]:
    """The importable packages ``kinds`` need with these settings -> what for."""
    kinds = set(kinds)
    needed = {"faststream": "the worker runtime", "sqlalchemy": "the database"}
    if kinds & SQL_KINDS:
        driver = _driver(settings.database_url())
        if driver:
            needed[driver] = f"the database driver of {settings.database_url().split('://', 1)[0]}"
    if kinds & INDEX_KINDS:
        embedder = settings.indexing.embedder
        if embedder == "local":
            for package in ("onnxruntime", "tokenizers", "numpy"):
                needed[package] = "the local embedder (indexing.embedder=local; `none`: keyword search only)"
        elif embedder == "openai":
            needed["httpx"] = "the OpenAI embedder (indexing.embedder=openai)"
        if settings.index_backend() == "weaviate":
            needed["weaviate"] = "the Weaviate index (indexing.weaviate.url)"
    if "query" in kinds and (
        settings.cache.backend == "redis" or (settings.cache.backend == "auto" and settings.cache.redis_url)
    ):
        needed["redis"] = "the Redis cache (cache.redis_url)"
    if "summarizer" in kinds and settings.summarizer.kind == "llm":
        needed["httpx"] = "the LLM summarizer (summarizer.kind=llm)"
    if "http" in kinds:
        needed["fastapi"] = needed["uvicorn"] = "the HTTP gateway"
    return needed


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None  # without importing it
    except (ImportError, ValueError):
        return False


def problems(
    settings: Settings,
    kinds: Iterable[str],
    *,
    embedded_nats: bool,
    installed: Callable[[str], bool] = _installed,
) -> list[str]:
    """Everything that would stop ``kinds`` from starting, one line each.

    :param embedded_nats: `memq up` starts nats-server on ``nats.port``.
    """
    kinds = list(kinds)
    found: list[str] = []
    if embedded_nats and (pid := running_pid(settings.run_dir)) is not None:
        # its ports would be reported as taken, which says less
        return [f"`memq up` (nats-server pid {pid}) already runs on {settings.data_dir}: stop it, or set MEMQ_DATA_DIR"]
    if embedded_nats:
        try:
            nats_server_binary()
        except EmbeddedError as exc:
            found.append(str(exc))
    missing = {p: why for p, why in needed_packages(settings, kinds).items() if not installed(p)}
    for package, why in missing.items():
        found.append(f"{package} is not installed, and {why} needs it: {INSTALL}")
    # Only what writes there: a replica on a read-only disk with a database
    # server and Weaviate (infra/k8s) needs no data dir.
    writes_data_dir = (
        embedded_nats
        or (settings.database.url is None and bool(set(kinds) & SQL_KINDS))
        or (settings.index_backend() == "embedded" and bool(set(kinds) & INDEX_KINDS))
    )
    if writes_data_dir:
        found.append(data_dir_problem(settings.data_dir) or "")
    listeners: list[tuple[str, str, int, str]] = []
    if embedded_nats:
        listeners.append(
            ("the embedded nats-server", "127.0.0.1", settings.nats.port, "--nats-port or MEMQ_NATS__PORT")
        )
    if "http" in kinds:
        listeners.append(("the HTTP gateway", settings.http.host, settings.http.port, "--http-port or MEMQ_HTTP__PORT"))
    if settings.metrics.port is not None:
        listeners.append(("the metrics server", settings.metrics.host, settings.metrics.port, "MEMQ_METRICS__PORT"))
    ports: dict[int, str] = {}
    for what, host, port, option in listeners:
        change = f"stop the program that listens there, or pick another port with {option} (0: any free port)"
        if port and port in ports:
            found.append(f"{what} and {ports[port]} are both set to port {port}: pick another with {option}")
            continue
        ports[port] = what
        found.append(port_problem(what, host, port, change) or "")
    return [line for line in found if line]
