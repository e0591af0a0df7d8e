"""CPU quotas for benchmark processes without containers: a cgroup each.

:class:`Quotas` makes one cgroup per process under a parent of its own,
holds it to ``cores`` of CPU (the CFS quota: ``cores × period`` of CPU time
every 100 ms period, what ``podman --cpus`` and a Kubernetes CPU limit set),
moves the process in, reads how often the kernel throttled it, and removes
every cgroup it made at :meth:`close`. The parent's weight grows with its
children (N times the default for N processes), so that on a loaded machine
the confined processes keep the share they had as plain processes: the
quota caps them and takes nothing else away.

Two layouts are found:

- **cgroup v2** (``/sys/fs/cgroup/cgroup.controllers`` lists ``cpu``): the
  limit is ``cpu.max`` ("25000 100000"), enabled for the children through
  the parent's ``cgroup.subtree_control``;
- **cgroup v1** (a ``cpu`` hierarchy, as on a hybrid host whose unified
  tree has no cpu controller, such as the 2-core VM of the docs): the limit
  is ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``.

Either needs write access to the hierarchy (root, or a delegated subtree);
without it :class:`Unavailable` says why, and the benchmark asks for
``--quota 0`` (no limits) instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
# The default weight of a cgroup, and of a task beside it (cpu.shares in v1, cpu.weight in v2).
WEIGHT = {"v1": ("cpu.shares", 1024), "v2": ("cpu.weight", 100)}


class Unavailable(RuntimeError):
    """No cgroup hierarchy with the cpu controller that this process may write."""


@dataclass(frozen=True)
class Throttling:
    """A cgroup's CFS counters so far (subtract two to get a step's)."""

    periods: int  # enforcement periods in which the cgroup ran
    throttled: int  # of them, those in which it used its whole quota and waited
    throttled_s: float  # time spent waiting for the next period

    def since(self, before: Throttling) -> Throttling:
        return Throttling(
            self.periods - before.periods,
            self.throttled - before.throttled,
            round(self.throttled_s - before.throttled_s, 3),
        )


def find_hierarchy(root: Path = ROOT) -> tuple[str, Path]:
    """("v2" | "v1", the folder to make cgroups in), or raise Unavailable."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return "v2", root
    for name in ("cpu", "cpu,cpuacct"):
        if (root / name / "cpu.cfs_quota_us").is_file():
            return "v1", root / name
    raise Unavailable(f"no cgroup hierarchy with the cpu controller under {root} (neither v2 cpu.max nor v1 cpu)")


class Quotas:
    """The cgroups of one benchmark run: ``<hierarchy>/<name>/<process>``."""

    def __init__(self, name: str, root: Path = ROOT):
        self.version, self.base = find_hierarchy(root)
        self.parent = self.base / name
        self.children: dict[str, Path] = {}
        try:
            self.parent.mkdir()
            if self.version == "v2":
                (self.parent / "cgroup.subtree_control").write_text("+cpu")
        except OSError as exc:
            self._remove(self.parent)
            raise Unavailable(f"cannot make a cgroup in {self.base} ({self.version}): {exc}") from exc

    def confine(self, name: str, pid: int, cores: float) -> Path:
        """Move ``pid`` (all its threads, and what it forks later) into a new
        cgroup ``name`` held to ``cores`` of CPU."""
        path = self.parent / name
        path.mkdir()
        self.children[name] = path
        quota = max(1000, round(cores * PERIOD_US))  # the kernel's floor is 1 ms a period
        if self.version == "v2":
            (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        (path / "cgroup.procs").write_text(str(pid))
        # On a busy machine a cgroup competes with its siblings (every other
        # process at the top) as one task: a parent of N replicas at the
        # default weight would get one process's share, not N. N times the
        # default keeps their share what it was, so confining only caps them.
        name, default = WEIGHT[self.version]
        (self.parent / name).write_text(
            str(min(default * len(self.children), 10_000 if self.version == "v2" else 262_144))
        )
        return path

    def limit(self, name: str) -> float:
        """The cores cgroup ``name`` is held to, read back from the kernel."""
        path = self.children[name]
        if self.version == "v2":
            quota, period = (path / "cpu.max").read_text().split()
            return float("inf") if quota == "max" else int(quota) / int(period)
        quota = int((path / "cpu.cfs_quota_us").read_text())
        return float("inf") if quota < 0 else quota / int((path / "cpu.cfs_period_us").read_text())

    def throttling(self, name: str) -> Throttling:
        stat = dict(line.split() for line in (self.children[name] / "cpu.stat").read_text().splitlines() if line)
        if self.version == "v2":
            waited = int(stat.get("throttled_usec", 0)) / 1e6
        else:
            waited = int(stat.get("throttled_time", 0)) / 1e9
        return Throttling(int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0)), waited)

    def close(self) -> list[str]:
        """Move what is left back to the top and remove every cgroup made;
        the ones that could not be removed (with why), for the caller to report."""
        left = []
        for path in reversed(list(self.children.values())):
            if not self._remove(path):
                left.append(str(path))
        self.children.clear()
        if not self._remove(self.parent):
            left.append(str(self.parent))
        return left

    def _remove(self, path: Path) -> bool:
        if not path.exists():
            return True
        try:
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    (self.base / "cgroup.procs").write_text(pid)
                except ProcessLookupError:  # it exited meanwhile
                    pass
            os.rmdir(path)  # a cgroup is removed with rmdir, its control files and all
            return True
        except OSError:
            return False

    def __enter__(self) -> Quotas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
