"""Runtime benchmark: memq's hot paths beside their FastStream alternatives, same run.

Usage::

    .venv/bin/python tests/run_bench.py runtime [--quick] [--runs N] [--json PATH]

The worker process is a FastStream app (``memq.workers.runtime.app``), but three hot
paths stay on nats-py inside it, on the broker's connection, for reasons
measured here against a nats-server this script starts (``tests/services.py``):

(a) **batch consume** — memq's owned loop (``memq.workers.runtime.consumer.BatchConsumer``,
    batch 100, 20 ms window) against a FastStream ``PullSub(batch_size=100,
    timeout=0.02, batch=True)`` subscriber, both decoding and acking every
    message:

    - *backlog*: N messages (20,000; ``--quick`` 5,000) are in the stream
      before the consumer starts; messages/s from its start to the last ack;
    - *trickle*: 25 messages every 10 ms for T s (10; ``--quick`` 4) while
      it runs; a batch is *late* when any of its messages is a redelivery
      (it was fetched once and lost, and came back after ``ack_wait``, 2 s
      here). Late batches are what stalls read-your-writes in memq.

(b) **request/reply** — a nats micro endpoint (what the query worker runs)
    against a FastStream subscriber that returns its reply, each in a server
    process of its own and each decoding a JSON request and encoding a JSON
    reply: p50 latency one request at a time (2,000; ``--quick`` 300), and
    requests/s with 64 in flight (20,000; ``--quick`` 3,000).

(c) **commit notices** — what the query worker does with each
    ``memq.v1.committed.<durable>`` notice (one per persistence batch, two
    per agent turn, each waking a read-your-writes read): a nats-py
    subscription parsing it with pydantic (what the query worker runs)
    against a FastStream subscriber typed with the same model, each in a
    process of its own: the process's CPU µs per notice (``/proc``) and
    notices/s, for N notices (20,000; ``--quick`` 5,000) published at once.

Every figure is the median of ``--runs`` runs (3 by default); the ratios are
FastStream's figure over the owned one's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
import orjson
import services
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, process_cpu, status, warn_if_busy
from memq.workers.runtime.consumer import BatchConsumer

STREAM = "BENCH_RUNTIME"
SUBJECT = "bench.rt.events"
BATCH = 100
WINDOW_S = 0.02
ACK_WAIT_S = 2.0
PAYLOAD = orjson.dumps({"kind": "event", "text": "we talked about the trip to Lyon in May " * 4})
REQUEST = orjson.dumps({"v": 1, "app": "bench", "user": "ada", "session": "s1", "limit": 20})
CONCURRENCY = 64


@dataclass
class Size:
    backlog: int
    trickle_s: float
    one_at_a_time: int
    concurrent: int
    notices: int


FULL = Size(backlog=20_000, trickle_s=10.0, one_at_a_time=2_000, concurrent=20_000, notices=20_000)
QUICK = Size(backlog=5_000, trickle_s=4.0, one_at_a_time=300, concurrent=3_000, notices=5_000)
SMOKE = Size(backlog=500, trickle_s=1.0, one_at_a_time=50, concurrent=300, notices=500)  # the unit test's run


@dataclass
class ConsumeRun:
    per_s: float = 0.0  # backlog drained per second
    trickle_msgs: int = 0
    batches: int = 0
    late_batches: int = 0
    redelivered: int = 0
    missing: int = 0  # never acked by the end of the run


@dataclass
class Tally:
    """What a consumer under test saw: every message acked, once each."""

    expected: int
    seen: set = field(default_factory=set)
    batches: int = 0
    late_batches: int = 0
    redelivered: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def batch(self, msgs) -> None:
        self.batches += 1
        again = sum(1 for m in msgs if (m.metadata.num_delivered or 1) > 1)
        self.redelivered += again
        self.late_batches += again > 0
        self.seen.update(m.metadata.sequence.stream for m in msgs)
        if len(self.seen) >= self.expected:
            self.done.set()


# --- (a) batch consume ----------------------------------------------------------------


def consumer_config(durable: str) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT_S,
        max_deliver=-1,
        max_ack_pending=BATCH * 8,
    )


class Owned:
    name = "owned BatchConsumer (nats-py)"

    async def start(self, url: str, durable: str, tally: Tally) -> None:
        self.nc = await nats.connect(url, name="bench-owned")

        async def handle(msgs) -> None:
            bodies = [orjson.loads(m.data) for m in msgs]  # FastStream decodes each body too
            assert len(bodies) == len(msgs)
            for m in msgs:
                await m.ack()
            tally.batch(msgs)

        self.consumer = BatchConsumer(
            self.nc,
            stream=STREAM,
            subject=SUBJECT,
            config=consumer_config(durable),
            handler=handle,
            batch_size=BATCH,
            batch_wait_s=WINDOW_S,
        )
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.nc.close()


class FastStreamBatch:
    name = "FastStream PullSub(batch=True)"

    async def start(self, url: str, durable: str, tally: Tally) -> None:
        from faststream.middlewares import AckPolicy as FsAck
        from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub

        # Its log would show the lost batches as tracebacks: they are counted instead.
        quiet = logging.getLogger("bench.faststream")
        quiet.setLevel(logging.CRITICAL)
        self.broker = NatsBroker(url, name="bench-faststream", logger=quiet, graceful_timeout=5.0)

        @self.broker.subscriber(
            SUBJECT,
            stream=JStream(STREAM, declare=False),
            durable=durable,
            config=consumer_config(durable),
            pull_sub=PullSub(batch_size=BATCH, timeout=WINDOW_S, batch=True),
            ack_policy=FsAck.MANUAL,
        )
        async def handle(body: list[dict], message: NatsMessage) -> None:
            msgs = message.raw_message
            for m in msgs:
                await m.ack()
            tally.batch(msgs)

        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()


async def publish_backlog(js, n: int) -> None:
    futures = [await js.publish_async(SUBJECT, PAYLOAD) for _ in range(n)]
    await asyncio.gather(*futures)


async def trickle(js, seconds: float) -> int:
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.gather(*[await js.publish_async(SUBJECT, PAYLOAD) for _ in range(25)])
        sent += 25
        await asyncio.sleep(0.01)
    return sent


async def consume_once(url: str, impl, size: Size) -> ConsumeRun:
    nc = await nats.connect(url, name="bench-publisher")
    js = nc.jetstream()
    try:
        await js.delete_stream(STREAM)
    except Exception:
        pass
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE))
    try:
        await publish_backlog(js, size.backlog)
        tally = Tally(expected=size.backlog)
        started = time.perf_counter()
        await impl.start(url, f"bench-{uuid.uuid4().hex[:8]}", tally)
        try:
            await asyncio.wait_for(tally.done.wait(), 300)
            per_s = size.backlog / (time.perf_counter() - started)
            batches_before = tally.batches
            sent = await trickle(js, size.trickle_s)
            tally.expected += sent
            tally.done.clear()
            if len(tally.seen) >= tally.expected:
                tally.done.set()
            try:  # a lost batch comes back after ack_wait: wait for it
                await asyncio.wait_for(tally.done.wait(), ACK_WAIT_S * 10)
            except TimeoutError:
                pass
            missing = tally.expected - len(tally.seen)
        finally:
            await impl.stop()
        return ConsumeRun(
            per_s=per_s,
            trickle_msgs=sent,
            batches=tally.batches - batches_before,
            late_batches=tally.late_batches,
            redelivered=tally.redelivered,
            missing=missing,
        )
    finally:
        await nc.close()


# --- (b) request/reply -----------------------------------------------------------------

SERVE_MICRO = """
import asyncio, sys, orjson, nats
from memq.workers.runtime.bus import settle
from nats.micro import add_service
async def main():
    nc = await nats.connect(sys.argv[1])
    svc = await add_service(nc, name="bench-micro", version="0.0.1", queue_group="bench")
    async def echo(req):
        body = orjson.loads(req.data)
        await req.respond(orjson.dumps({"ok": True, "result": body}))
    await svc.add_endpoint(name="echo", subject="bench.rr.micro", handler=echo)
    await settle(nc)  # the server has the subscription before we say so
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

SERVE_FASTSTREAM = """
import asyncio, sys
from faststream.nats import NatsBroker
from memq.workers.runtime.bus import settle
async def main():
    broker = NatsBroker(sys.argv[1], log_level=10)
    @broker.subscriber("bench.rr.faststream", queue="bench")
    async def echo(body: dict) -> dict:
        return {"ok": True, "result": body}
    await broker.start()
    await settle(broker.connection)
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@dataclass
class ReplyRun:
    p50_ms: float
    per_s: float


async def request_once(url: str, server: str, subject: str, size: Size) -> ReplyRun:
    proc = subprocess.Popen([sys.executable, "-c", server, url], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", "the reply server did not start"
        nc = await nats.connect(url, name="bench-requester")
        try:
            for _ in range(20):  # warm up
                await nc.request(subject, REQUEST, timeout=5)
            latencies = []
            for _ in range(size.one_at_a_time):
                t0 = time.perf_counter()
                reply = await nc.request(subject, REQUEST, timeout=5)
                latencies.append((time.perf_counter() - t0) * 1000)
            assert orjson.loads(reply.data)["ok"] is True
            left = size.concurrent

            async def requester() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await nc.request(subject, REQUEST, timeout=10)

            t0 = time.perf_counter()
            await asyncio.gather(*(requester() for _ in range(CONCURRENCY)))
            per_s = size.concurrent / (time.perf_counter() - t0)
        finally:
            await nc.close()
        return ReplyRun(p50_ms=percentile(latencies, 50), per_s=per_s)
    finally:
        proc.kill()
        proc.wait()


# --- (c) commit notices ----------------------------------------------------------------

# Each prints "done" once it has handled argv[2] notices.
HEAR_NATS_PY = """
import asyncio, sys, nats
from memq.workers.runtime.bus import settle
from memq.contracts.notices import CommittedRanges
async def main():
    nc = await nats.connect(sys.argv[1])
    want, done = int(sys.argv[2]), asyncio.Event()
    heard = []
    async def on(msg):
        heard.append(CommittedRanges.model_validate_json(msg.data))
        if len(heard) == want:
            done.set()
    await nc.subscribe("bench.notice.nats-py", cb=on)
    await settle(nc)
    print("ready", flush=True)
    await done.wait()
    print("done", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

HEAR_FASTSTREAM = """
import asyncio, logging, sys
from faststream.nats import NatsBroker
from memq.workers.runtime.bus import settle
from memq.contracts.notices import CommittedRanges
async def main():
    broker = NatsBroker(sys.argv[1], logger=logging.getLogger("quiet"))
    want, done = int(sys.argv[2]), asyncio.Event()
    heard = []
    @broker.subscriber("bench.notice.faststream")
    async def on(notice: CommittedRanges) -> None:
        heard.append(notice)
        if len(heard) == want:
            done.set()
    await broker.start()
    await settle(broker.connection)
    print("ready", flush=True)
    await done.wait()
    print("done", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@dataclass
class NoticeRun:
    cpu_us: float  # the hearing process's CPU per notice
    per_s: float


def notice_body(i: int) -> bytes:
    from memq.contracts.notices import CommitNotice, CommittedRanges

    changed = [CommitNotice(app="bench", user="ada", session=f"s{i % 50}", seq=i + 1)]
    return CommittedRanges.of([i + 1], changed).encode()


async def notices_once(url: str, script: str, subject: str, n: int) -> NoticeRun:
    proc = subprocess.Popen([sys.executable, "-c", script, url, str(n)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", "the notice hearer did not start"
        bodies = [notice_body(i) for i in range(n)]
        nc = await nats.connect(url, name="bench-notices")
        try:
            before = process_cpu()[proc.pid][1]
            t0 = time.perf_counter()
            for i, body in enumerate(bodies):
                await nc.publish(subject, body)
                if i % 100 == 99:  # core NATS: do not outrun a slow consumer's buffer
                    await nc.flush()
            await nc.flush()
            done = await asyncio.to_thread(proc.stdout.readline)
            assert done.strip() == "done", "the notice hearer missed notices"
            per_s = n / (time.perf_counter() - t0)
            cpu = process_cpu()[proc.pid][1] - before
        finally:
            await nc.close()
        return NoticeRun(cpu_us=cpu * 1e6 / n, per_s=per_s)
    finally:
        proc.kill()
        proc.wait()


# --- the run ------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def measure(size: Size, runs: int) -> dict:
    results: dict = {"consume": {}, "reply": {}, "notices": {}}
    with services.NatsServer() as server:
        for impl in (Owned(), FastStreamBatch()):
            seen = []
            for i in range(runs):
                status(f"  consume, {impl.name}: run {i + 1}/{runs} …")
                seen.append(await consume_once(server.url, impl, size))
            results["consume"][impl.name] = {
                "per_s": median([r.per_s for r in seen]),
                "late_batches": [r.late_batches for r in seen],
                "redelivered": [r.redelivered for r in seen],
                "trickle_batches": [r.batches for r in seen],
                "missing": [r.missing for r in seen],
            }
        for name, script, subject in (
            ("nats micro endpoint", SERVE_MICRO, "bench.rr.micro"),
            ("FastStream subscriber", SERVE_FASTSTREAM, "bench.rr.faststream"),
        ):
            seen = []
            for i in range(runs):
                status(f"  request/reply, {name}: run {i + 1}/{runs} …")
                seen.append(await request_once(server.url, script, subject, size))
            results["reply"][name] = {
                "p50_ms": median([r.p50_ms for r in seen]),
                "per_s": median([r.per_s for r in seen]),
            }
        for name, script, subject in (
            ("nats-py subscription", HEAR_NATS_PY, "bench.notice.nats-py"),
            ("FastStream subscriber", HEAR_FASTSTREAM, "bench.notice.faststream"),
        ):
            heard = []
            for i in range(runs):
                status(f"  commit notices, {name}: run {i + 1}/{runs} …")
                heard.append(await notices_once(server.url, script, subject, size.notices))
            results["notices"][name] = {
                "cpu_us": median([r.cpu_us for r in heard]),
                "per_s": median([r.per_s for r in heard]),
            }
    return results


def print_results(machine: dict, size: Size, runs: int, results: dict) -> None:
    console.print()
    console.print(
        f"[bold]memq runtime benchmark[/] — {machine['date']}, memq {machine['git']}, "
        f"FastStream {machine['faststream']}, nats-py {machine['nats_py']}\n"
        f"{machine['nproc']} cores, {machine['cpu']}, Python {machine['python']}, {machine['nats_server']}, "
        f"CPU {machine['cpu_busy_at_start']:.0%} busy before the run; medians of {runs} run(s)"
    )
    consume = results["consume"]
    owned = consume["owned BatchConsumer (nats-py)"]
    table = Table(title=f"batch consume: {size.backlog:,} backlog, then a {size.trickle_s:.0f} s trickle")
    for col in ("path", "msgs/s", "× owned", "late batches (per run)", "redelivered msgs (per run)", "never acked"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for name, row in consume.items():
        table.add_row(
            name,
            f"{row['per_s']:,.0f}",
            f"{row['per_s'] / owned['per_s']:.2f}",
            ", ".join(map(str, row["late_batches"])),
            ", ".join(map(str, row["redelivered"])),
            ", ".join(map(str, row["missing"])),
        )
    console.print(table)
    for title, key, base, short, measures in (
        (
            f"request/reply: p50 one at a time, throughput with {CONCURRENCY} in flight",
            "reply",
            "nats micro endpoint",
            "micro",
            (("p50_ms", "p50 ms", ".3f"), ("per_s", "req/s", ",.0f")),
        ),
        (
            f"commit notices: {size.notices:,} published at once, CPU of the hearing process",
            "notices",
            "nats-py subscription",
            "nats-py",
            (("cpu_us", "CPU µs/notice", ".1f"), ("per_s", "notices/s", ",.0f")),
        ),
    ):
        console.print(ratio_table(title, results[key], base, short, measures))


def ratio_table(
    title: str, rows: dict[str, dict], base: str, short: str, measures: tuple[tuple[str, str, str], ...]
) -> Table:
    """Each path's measures (key, column name, format), each beside its
    ratio to the ``base`` path's (``short`` names it in the header)."""
    table = Table(title=title)
    table.add_column("path")
    for _, name, _ in measures:
        table.add_column(name, justify="right")
        table.add_column(f"× {short}", justify="right")
    for path, row in rows.items():
        cells = []
        for key, _, fmt in measures:
            # CPU is read in clock ticks (10 ms): a smoke run may see none
            ratio = f"{row[key] / rows[base][key]:.2f}" if rows[base][key] else "—"
            cells += [format(row[key], fmt), ratio]
        table.add_row(path, *cells)
    return table


def versions() -> dict:
    from importlib.metadata import version

    return {"faststream": version("faststream"), "nats_py": version("nats-py")}


async def main(size: Size, runs: int, json_path: Path | None, label: str) -> int:
    machine = {**machine_info(), **versions()}
    warn_if_busy(machine)
    results = await measure(size, runs)
    print_results(machine, size, runs, results)
    if json_path is not None:
        json_path.write_text(
            json.dumps(
                {"machine": machine, "size": label, "sizes": asdict(size), "runs": runs, "results": results}, indent=2
            )
        )
        status(f"results written to {json_path}")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (the test suite's check)")
    parser.add_argument("--runs", type=int, default=3, help="runs per path; medians are shown (default 3)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    label = "smoke" if args.smoke else "quick" if args.quick else "full"
    chosen = SMOKE if args.smoke else QUICK if args.quick else FULL
    sys.exit(asyncio.run(main(chosen, max(1, args.runs), args.json, label)))
