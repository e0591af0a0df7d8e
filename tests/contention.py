"""How much other work competes for the CPU while a test runs, so that a
time bound can scale with it: "within 5 s" on an idle machine becomes 5 s
times the contention factor on a loaded one (CI runners, the shared 2-core
machine), and still fails on a delay of memq's own making.

The factor is the mean number of runnable tasks (``procs_running`` in
/proc/stat, sampled from a thread) per core, at least 1 and at most
``MAX_FACTOR``: past that a bound would no longer catch anything.
"""

from __future__ import annotations

import os
import statistics
import threading
from pathlib import Path

MAX_FACTOR = 10.0
STAT = Path("/proc/stat")


def runnable() -> int | None:
    """Tasks running or ready to run right now (this reader included), or
    None where /proc/stat is not there."""
    try:
        for line in STAT.read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def factor_of(samples: list[int], cores: int) -> float:
    """Pure: the contention factor of ``samples`` of runnable tasks."""
    if not samples:
        return 1.0
    return min(MAX_FACTOR, max(1.0, statistics.mean(samples) / cores))


class CpuContention:
    """Samples :func:`runnable` every ``every_s`` between ``start()`` and
    ``stop()`` (or as a context manager); :attr:`factor` says how contended
    the CPU was meanwhile."""

    def __init__(self, every_s: float = 0.2):
        self.every_s = every_s
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu contention", daemon=True)

    def _run(self) -> None:
        while True:
            if (n := runnable()) is not None:
                self.samples.append(n)
            if self._stop.wait(self.every_s):
                return

    def start(self) -> CpuContention:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> CpuContention:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def factor(self) -> float:
        return factor_of(list(self.samples), self.cores)
