"""The system under test: every worker a real `memq worker <kind>` process.

One nested dict of overrides configures everything: :class:`Settings` for
this process (to read SQL and the index back) and ``MEMQ_*`` variables for
the worker processes, so both see the same configuration.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from helpers import WorkerProcess

from memq.workers.settings import Settings


def env_vars(overrides: dict[str, Any], prefix: str = "MEMQ") -> dict[str, str]:
    """``{"persistence": {"ack_wait_s": 3}}`` → ``{"MEMQ_PERSISTENCE__ACK_WAIT_S": "3"}``
    (lists as JSON, booleans lowercase), as pydantic-settings reads them."""
    out: dict[str, str] = {}
    for key, value in overrides.items():
        name = f"{prefix}_{key.upper()}" if prefix == "MEMQ" else f"{prefix}__{key.upper()}"
        if isinstance(value, dict):
            out.update(env_vars(value, name))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(list(value))
        elif isinstance(value, bool):
            out[name] = str(value).lower()
        else:
            out[name] = str(value)
    return out


class Stack:
    """Worker processes by kind; ``start``, ``kill`` (SIGKILL) and ``restart``."""

    def __init__(self, overrides: dict[str, Any], log_dir: Path):
        self.overrides = overrides
        self.settings = Settings(**overrides)
        self.env = {**env_vars(overrides), "MEMQ_LOG_LEVEL": "INFO"}
        self.log_dir = log_dir
        self.workers: dict[str, list[WorkerProcess]] = {}
        self._starts = 0

    def start(self, kind: str, replicas: int = 1) -> None:
        for _ in range(replicas):
            self.workers.setdefault(kind, []).append(self._spawn(kind))

    def _spawn(self, kind: str) -> WorkerProcess:
        self._starts += 1
        log = self.log_dir / f"{kind}-{self._starts}.log"
        return WorkerProcess(self.settings, log, kind=kind, env=self.env).start()

    def kill(self, kind: str, index: int = 0) -> int:
        """SIGKILL one replica (no chance to finish or ack anything); its pid."""
        proc = self.workers[kind][index]
        pid = proc.proc.pid
        proc.kill()
        assert proc.proc.returncode == -signal.SIGKILL
        return pid

    def restart(self, kind: str, index: int = 0) -> None:
        """Start the replica again; returns once it serves, so that a fault's
        recovery time is the system's, not the new process's start-up (imports,
        loading the model: seconds on a busy machine)."""
        self.workers[kind][index] = self._spawn(kind).wait_ready()

    def check_alive(self) -> None:
        dead = [
            f"{kind}[{i}] exited with {w.proc.returncode}:\n{w.log_tail(20)}"
            for kind, ws in self.workers.items()
            for i, w in enumerate(ws)
            if w.proc.poll() is not None
        ]
        assert not dead, "worker process(es) died on their own:\n" + "\n".join(dead)

    def stop(self) -> None:
        """SIGTERM every replica at once, then wait for each (SIGKILL after 30 s)."""
        running = [w for ws in self.workers.values() for w in ws if w.proc.poll() is None]
        for w in running:
            w.proc.send_signal(signal.SIGTERM)
        for w in running:
            w.stop()

    def log_tails(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- {kind}[{i}] ({w.log_path.name}) ---\n{w.log_tail(lines)}"
            for kind, ws in self.workers.items()
            for i, w in enumerate(ws)
        )
