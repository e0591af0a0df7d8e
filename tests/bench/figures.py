"""A benchmark's headline figures out of the JSON it writes, and whether two
sets of runs of it (two trees of the code) agree: compare_trees.py's pure part.

A figure is a number (or a yes/no) at a key path: ``rows[PostgreSQL,replicas=1]/p50_ms``.
A list of results is keyed by what names each item (its text fields and the
sizes in ``ID_KEYS``), not by position, so one tree measuring a configuration
more does not shift every row after it. The machine, the configuration and
per-process CPU tables are not figures; the headline ones are throughputs,
latencies at p50/p99, quality (recall, evidence, cosine) and counts.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# What a run was measured on or asked for, not what it measured; and "counted",
# the query bench's check of its rows (requests the workers counted as cache
# hits or misses: as many as the run's throughput, not a fixed count).
NOT_FIGURES = {
    "machine",
    "config",
    "args",
    "cpu_ms_per_1k",
    "cpu_ms_per_turn",
    "cpu_ms_per_request",
    "cpu",
    "counted",
}
# Integer fields that name a configuration (a row's size), not a result.
ID_KEYS = {"replicas", "agents", "concurrency", "users", "budget", "workers", "size", "k", "limit", "events_per_user"}
# Timed: noisy by nature, compared by their spread.
TIMED = re.compile(r"(^|_)p(50|90|95|99)(_|$)|per_s|texts_per_s|throughput|(^|_)ms_per_text")
# Quality and counts: fixed data gives the same answer every run.
COUNTED = re.compile(
    r"recall|evidence|cosine|precision|mrr|ndcg|hit|accuracy|exactly_once|over_budget|"
    r"^(n|events|messages|rows|docs|indexed|questions|expected_rows|stored_rows|stored_distinct|errors|"
    r"missed|ryw_violations|lost|duplicates)$"
)
# A target's met/passed is not a figure: it follows a timed one across its line.


def headline(key: str) -> bool:
    return bool(TIMED.search(key) or COUNTED.search(key))


def timed(path: str) -> bool:
    """A timed figure: its key or the table it is in (``ms_per_text/<how>``) says so."""
    return any(TIMED.search(key) for key in path.split("/")[-2:])


def item_label(item: Any, index: int) -> str:
    """What names one result of a list: its text fields and configuration sizes."""
    if not isinstance(item, Mapping):
        return str(index)
    parts = [v for v in item.values() if isinstance(v, str)]  # a "config" name too: it names the row
    parts += [f"{k}={v}" for k, v in item.items() if k in ID_KEYS and isinstance(v, int) and not isinstance(v, bool)]
    return ",".join(parts)


def figures(data: Any, path: str = "", table: bool = False) -> Iterator[tuple[str, float]]:
    """Every headline figure of a benchmark's JSON, by key path; ``table``: a
    mapping whose key (or an enclosing one) names it (``steps_p50_ms``,
    ``recall``), so each of its numbers is one."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            if key in NOT_FIGURES:
                continue
            sub = f"{path}/{key}" if path else str(key)
            if isinstance(value, bool | int | float):
                if (table or headline(str(key))) and not (isinstance(value, float) and value != value):  # NaN
                    yield sub, float(value)
            elif isinstance(value, Mapping):  # a table's sub-tables too (recall/hybrid/overall/10)
                yield from figures(value, sub, table or headline(str(key)))
            else:
                yield from figures(value, sub)
    elif isinstance(data, Sequence) and not isinstance(data, str):
        labels = [item_label(item, i) for i, item in enumerate(data)]
        unique = len(set(labels)) == len(labels) and all(labels)
        for i, item in enumerate(data):
            yield from figures(item, f"{path}[{labels[i] if unique else i}]")


@dataclass
class Row:
    """One figure, old runs beside new."""

    figure: str
    old: list[float]
    new: list[float]

    @property
    def exact(self) -> bool:
        """A quality figure or a count that came out the same in every old run:
        deterministic on fixed data, so the new tree must give it exactly."""
        return not timed(self.figure) and len(set(self.old)) == 1

    @property
    def within(self) -> bool:
        """Exact figures: every new run equal to the old value. The rest: the
        two trees' ranges (min to max) overlap, i.e. the new median lies in
        the old spread widened by the new one."""
        if self.exact:
            return set(self.new) == set(self.old)
        return min(self.new) <= max(self.old) and min(self.old) <= max(self.new)

    def summary(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "kind": "exact" if self.exact else "spread",
            "old": {
                "median": statistics.median(self.old),
                "min": min(self.old),
                "max": max(self.old),
                "runs": self.old,
            },
            "new": {
                "median": statistics.median(self.new),
                "min": min(self.new),
                "max": max(self.new),
                "runs": self.new,
            },
            "within": self.within,
        }


def compare(old_runs: Sequence[Any], new_runs: Sequence[Any]) -> tuple[list[Row], list[str], list[str]]:
    """The figures every run of both trees reports, and the key paths only
    one tree's runs report (old-only, new-only)."""
    old = [dict(figures(r)) for r in old_runs]
    new = [dict(figures(r)) for r in new_runs]
    in_old = set.intersection(*(set(r) for r in old)) if old else set()
    in_new = set.intersection(*(set(r) for r in new)) if new else set()
    both = [k for k in old[0] if k in in_old and k in in_new] if old else []
    rows = [Row(k, [r[k] for r in old], [r[k] for r in new]) for k in both]
    return rows, sorted(in_old - in_new), sorted(in_new - in_old)
