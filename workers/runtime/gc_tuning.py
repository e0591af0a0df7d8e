"""Garbage-collector settings for a long-running worker process.

A worker allocates many short-lived objects per message (decoded models, rows,
dicts) beside a large heap built once (imported modules, SQLAlchemy metadata,
tiktoken's rank tables). With CPython's defaults a young collection runs every
700 allocations, so the objects of a batch in flight get promoted, and full
collections walk the whole heap again and again: 15-20 % of a persistence
worker's CPU under load (measured with py-spy and per-event CPU).
"""

from __future__ import annotations

import gc

# Young collections this many allocations apart: a batch's objects die before
# one runs, so few are promoted and full collections become rare. At ~100 bytes
# an object, at most a few MB of cyclic garbage wait for a collection.
THRESHOLDS = (50_000, 20, 20)


def settle_after_start() -> None:
    """Call once the process has started: what startup built is moved out of
    the collector's reach (it lives as long as the process), and collections
    run at :data:`THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
