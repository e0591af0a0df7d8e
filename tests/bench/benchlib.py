"""What every benchmark here shares: the machine header, percentiles, status
lines, the ``--json PATH`` result file."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from rich.console import Console

from memq.contracts.subjects import committed_subject
from memq.workers.runtime.bus import settle

# Wide enough for the result tables when the output goes to a file.
console = Console(width=None if sys.stdout.isatty() else 160)


def machine_info() -> dict:
    """The machine, the commit and the versions a result was measured with."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nats_bin = Path(sys.prefix) / "bin" / "nats-server"
    try:
        nats_version = subprocess.run([nats_bin, "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        nats_version = "unknown"
    return {
        "git": git_revision(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "nats_server": nats_version,
        "sqlite": sqlite3.sqlite_version,
        "cpu_busy_at_start": cpu_busy(),
    }


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of all cores busy over ``seconds`` (/proc/stat), before we start
    anything: other processes on the machine make the numbers noisy."""

    def sample() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return float("nan")
    return round(1 - (idle1 - idle0) / max(total1 - total0, 1), 3)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of every process on the machine,
    by pid, with its name: /proc/<pid>/stat. Two snapshots around a loop say
    what each process spent on it (see ``cpu_between``)."""
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        name, fields = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return out


def cpu_between(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], label: Callable[[int, str], str]
) -> dict[str, float]:
    """CPU seconds spent between two ``process_cpu`` snapshots, summed by
    ``label(pid, name)``. A process that ended in between is not counted,
    so measure around long-lived ones (servers, workers, pooled backends)."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        used = cpu - before.get(pid, (name, 0.0))[1]
        if used > 0:
            key = label(pid, name)
            spent[key] = spent.get(key, 0.0) + used
    return spent


def process_label(workers: dict[int, str]) -> Callable[[int, str], str]:
    """Who a process is, for a CPU table: this script ("client"), a memq
    worker (``workers``: pid → kind), a server, or "other" (the rest of the
    machine)."""
    me = os.getpid()
    servers = {"nats-server": "nats-server", "redis-server": "Redis"}

    def label(pid: int, name: str) -> str:
        if pid == me:
            return "client"
        if pid in workers:
            return workers[pid]
        if name.startswith("postgres"):
            return "PostgreSQL"
        return servers.get(name, "other")

    return label


def git_revision() -> str:
    """The commit measured, with "+dirty" when tracked files have changes."""

    def git(*args: str) -> str:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def status(text: str) -> None:
    console.print(text, highlight=False)


def write_json(path: Path | None, benchmark: str, machine: dict, **results: object) -> None:
    """Write a benchmark's results to ``path``, its ``--json PATH``, under its
    name and the machine it ran on; nothing when None. ``--json`` has no
    default, so a quick or smoke run never overwrites a published
    ``docs/benchmarks/results/<name>.json`` unless asked to."""
    if path is None:
        return
    path.write_text(json.dumps({"benchmark": benchmark, "machine": machine, **results}, indent=2) + "\n")
    status(f"results written to {path}")


def warn_if_busy(machine: dict) -> None:
    busy = machine["cpu_busy_at_start"]
    if busy >= 0.15:
        status(f"[yellow]the CPU was {busy:.0%} busy before the run: other processes share it; expect noise[/]")


class CommitClock:
    """When each stream sequence was committed, as a query worker learns it:
    the arrival of the persistence replicas' ``memq.v1.committed`` notice
    that names it (exact with any number of replicas). A notice can arrive
    before the PubAck of its own append is read, so every seq is kept until
    popped or ``reset``."""

    def __init__(self, durable: str = "memq-persistence") -> None:
        self.durable = durable
        self.at: dict[int, float] = {}

    async def start(self, nc) -> None:
        async def heard(msg) -> None:
            t = time.perf_counter()
            for first, last in orjson.loads(msg.data)["ranges"]:
                for seq in range(first, last + 1):
                    self.at.setdefault(seq, t)

        await nc.subscribe(committed_subject(self.durable), cb=heard)
        await settle(nc)  # the workers publish on connections of their own: no notice missed

    def reset(self) -> None:
        self.at.clear()
