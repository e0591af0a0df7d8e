"""How long to wait before the next try: the delay schedules memq retries on.

Pure functions (no I/O, no clock; the jitters draw from :mod:`random`), in
``contracts/`` so that the client and the workers share them (contracts never
import workers: ``contracts-light``). Two shapes:

- a fixed schedule, its last entry repeated (:func:`stepped`): the workers'
  batch redelivery (``retry_delays_s``, counted by JetStream's deliveries) and
  the Weaviate backend's reconnects;
- doubling from a first delay up to a cap (:func:`doubling`), spread by a
  jitter so that clients cut off together do not retry together:
  :func:`equal_jitter` (between half the delay and all of it: the client's
  publish retries), :func:`spread` (± a fraction: the HTTP clients of
  OpenAI-compatible endpoints, which cap after the spread and let a server's
  Retry-After win), or full jitter (``uniform(0, delay)``: LangGraph's racing
  puts of one item); unjittered where one process waits alone (JetStream's
  startup patience in ``bus.patiently``, the client's wait for slow acks, the
  commit floor's poll, which the importer waits on too).

``attempt`` counts from 0: the delay before the second try is ``attempt=0``.

Why not tenacity (which some extras pull in) or backoff: their wait
strategies come with a retry loop around a call, and memq's callers keep
their own loops (the client's publish settling decides per error whether to
try again, batch redelivery is JetStream's ``nak(delay)``); the four
functions here are the only part they share, and the client, which agents
install, stays without a dependency for them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def stepped(delays: Sequence[float], attempt: int) -> float:
    """``delays[attempt]``, and the last entry for every attempt after it."""
    return delays[min(attempt, len(delays) - 1)]


def doubling(attempt: int, first_s: float, max_s: float = math.inf) -> float:
    """``first_s * 2**attempt``, never above ``max_s``."""
    return min(max_s, first_s * 2**attempt)


def equal_jitter(delay: float) -> float:
    """A random delay between ``delay / 2`` and ``delay``."""
    return random.uniform(delay / 2, delay)


def spread(delay: float, fraction: float) -> float:
    """``delay`` times a random factor within ``1 ± fraction``."""
    return delay * random.uniform(1 - fraction, 1 + fraction)
