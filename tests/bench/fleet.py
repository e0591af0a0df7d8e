"""Worker replicas as real processes, and what they cost (for ``scale.py``).

:class:`Fleet` starts ``memq worker <kind>`` processes (replicas sharing one
durable consumer or queue group), SIGKILLs one on demand and stops them all
at the end: SIGTERM, then SIGKILL after a grace period. Each replica also
gets PR_SET_PDEATHSIG, so the kernel kills it if the benchmark dies without
cleaning up (a crash, a second Ctrl-C).

:func:`sample` reads a process's CPU time and memory from ``/proc`` (no
psutil): ``utime + stime`` and ``VmHWM`` (peak resident set) / ``VmRSS``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import helpers
import services

from memq.workers.settings import Settings

KINDS = ("persistence", "indexing", "summarizer", "query")
# bus.connect names a worker's connection f"{settings.nats.name}-{worker}"
CONNECTION_NAMES = {kind: f"memq-{kind}" for kind in KINDS}
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    """One process at one moment: CPU seconds used so far, memory in MiB."""

    cpu_s: float
    peak_rss_mib: float  # VmHWM: the high-water mark since the process started
    rss_mib: float


def sample(pid: int) -> Usage | None:
    """None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    mem = {}
    for line in status.splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            key, value = line.split(":", 1)
            mem[key] = int(value.split()[0]) / 1024  # kB
    # stat fields after the command: state is [0], utime [11], stime [12]
    return Usage((int(stat[11]) + int(stat[12])) / TICK, mem.get("VmHWM", 0.0), mem.get("VmRSS", 0.0))


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process and its descendants, reaped ones included
    (cutime/cstime): PostgreSQL runs a backend process per connection."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(f) for f in fields[11:15])
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in parents.items():
        children[ppid].append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total / TICK


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


class Replica(helpers.WorkerProcess):
    """A ``memq worker <kind>`` process that dies with the benchmark."""

    def __init__(self, settings: Settings, kind: str, index: int, env: dict[str, str], log_dir: Path):
        super().__init__(settings, log_dir / f"{kind}-{index}.log", kind, env)
        self.index = index
        self.killed = False
        self.last: Usage | None = None  # the last sample while it ran

    def start(self) -> Replica:
        with open(self.log_path, "ab") as log:
            # PDEATHSIG follows the forking thread: start replicas from the main thread.
            self.proc = subprocess.Popen(
                [str(helpers.MEMQ), "worker", self.kind],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=services._die_with(os.getpid()),
            )
        return self

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sample(self) -> Usage | None:
        usage = sample(self.pid) if self.alive else None
        self.last = usage or self.last
        return usage

    def sigkill(self) -> None:
        """Like a crash (the OOM killer, a node lost): no shutdown code runs."""
        self.sample()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.killed = True


class Fleet:
    """Every replica this benchmark started, by kind."""

    def __init__(self, settings: Settings, env: dict[str, str], log_dir: Path, kinds: tuple[str, ...] = KINDS):
        """``settings`` become MEMQ_* variables (helpers.settings_env); ``env`` adds more."""
        self.settings, self.env, self.log_dir, self.kinds = settings, env, log_dir, kinds
        self.replicas: dict[str, list[Replica]] = {kind: [] for kind in kinds}

    def scale_to(self, n: int) -> list[Replica]:
        """Start replicas until every kind has ``n`` running; the new ones."""
        started = []
        for kind in self.kinds:
            while len(self.running(kind)) < n:
                replica = Replica(self.settings, kind, len(self.replicas[kind]), self.env, self.log_dir)
                self.replicas[kind].append(replica.start())
                started.append(replica)
        return started

    def running(self, kind: str) -> list[Replica]:
        return [r for r in self.replicas[kind] if r.alive]

    def all(self) -> list[Replica]:
        return [r for kind in self.kinds for r in self.replicas[kind]]

    def check_alive(self) -> None:
        """Raise if a replica we did not kill has exited (with its log)."""
        for r in self.all():
            if not r.killed and not r.alive:
                raise RuntimeError(f"worker {r.name} exited ({r.proc.returncode}):\n{r.log_tail()}")

    def pause(self, kind: str) -> None:
        """SIGSTOP every running replica of ``kind``: it keeps its connection
        and its unacked messages, and uses no CPU until :meth:`resume`."""
        for r in self.running(kind):
            r.proc.send_signal(signal.SIGSTOP)

    def resume(self, kind: str) -> None:
        for r in self.running(kind):
            r.proc.send_signal(signal.SIGCONT)

    def kill_one(self, kind: str) -> Replica:
        replica = self.running(kind)[0]
        replica.sigkill()
        return replica

    def usage(self) -> dict[str, Usage]:
        """A sample of every running replica, by name."""
        return {r.name: u for r in self.all() if (u := r.sample()) is not None}

    def stop(self, grace_s: float = 5.0) -> list[str]:
        """Stop every replica at once; the names of those that needed SIGKILL."""
        running = [r for r in self.all() if r.alive]
        for r in running:
            r.proc.send_signal(signal.SIGCONT)  # a stopped process would not see SIGTERM
            r.proc.send_signal(signal.SIGTERM)
        return [r.name for r in running if not r.stop(grace_s)]


def connections(cluster: services.NatsCluster) -> dict[str, int]:
    """Client connections per name, over every running node of the cluster."""
    counts: dict[str, int] = defaultdict(int)
    for node in cluster.nodes:
        if not node.running:
            continue
        url = f"http://{services.HOST}:{node.monitor_port}/connz?limit=10000"
        with urllib.request.urlopen(url, timeout=2) as r:
            for conn in json.load(r).get("connections") or []:
                counts[conn.get("name", "")] += 1
    return counts
