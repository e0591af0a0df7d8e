"""What every benchmark here shares: the machine header, percentiles, status lines."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

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


def warn_if_busy(machine: dict) -> None:
    busy = machine["cpu_busy_at_start"]
    if busy >= 0.15:
        status(f"[yellow]the CPU was {busy:.0%} busy before the run: other processes share it; expect noise[/]")
