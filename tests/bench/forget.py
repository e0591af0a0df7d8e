"""What ``forget_event`` costs, checked (the default) and with ``missing_ok``.

Usage::

    .venv/bin/python tests/run_bench.py forget [--n N]

The adapter tests' stack (``tests/adapter_stack.py``: a nats-server,
SQLite, and the persistence, indexing and query workers in this process).
For each mode, a session of N + 10 turns, committed; then N forgets, one at
a time, of its oldest turns; then one read with ``consistency="any"`` (it
waits until every forget is committed) that must hold the 10 left. p50/p90
of the forgets and the read's time, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from adapter_stack import memq_stack

from memq.contracts.client import MemoryClient


async def main(n: int) -> None:
    async with memq_stack(Path(tempfile.mkdtemp())) as url, await MemoryClient.connect(url, app="bench") as memq:
        for missing_ok in (False, True):
            user = f"u{uuid.uuid4().hex[:6]}"
            seqs = [await memq.append_text(user, "s", "user", f"turn {i}") for i in range(n + 10)]
            await memq.get_session(user, "s", consistency="any")
            times = []
            for seq in seqs[:n]:
                started = time.perf_counter()
                await memq.forget_event(user, "s", seq, missing_ok=missing_ok)
                times.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            view = await memq.get_session(user, "s", events=True, consistency="any")
            settled = (time.perf_counter() - started) * 1000
            assert [e.seq for e in view.events or ()] == seqs[n:]
            p90 = statistics.quantiles(times, n=10)[-1]
            print(
                f"forget_event missing_ok={missing_ok}: p50 {statistics.median(times):.1f} ms, p90 {p90:.1f} ms; "
                f"the read after {n} forgets: {settled:.0f} ms"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    asyncio.run(main(parser.parse_args().n))
