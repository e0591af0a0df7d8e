"""HTTP gateway benchmark: `history` and `context` over HTTP beside the same
requests over NATS, in the same run.

Usage::

    .venv/bin/python tests/run_bench.py gateway [--quick] [--json PATH]
        [--seconds S] [--rounds R] [--concurrency C] [--events N]

Everything runs on loopback, on servers and processes this script starts and
stops itself: one nats-server (``tests/services.py``), a SQLite file, and
``memq worker persistence``, ``memq worker query`` and ``memq worker http``
processes, as a user would start them (the gateway with an API key for the
app). One session of ``--events`` turns (300 characters each) is written
first; then each read is asked again and again:

- **nats**: ``MemoryClient.history`` / ``MemoryClient.context`` (one NATS
  request each: the session fits one page);
- **http**: ``GET …/history`` / ``GET …/context`` with the same parameters
  through httpx (keep-alive), with the app's API key; the gateway makes the
  same NATS request with its own ``MemoryClient``.

Both hit the query worker's cache the same way (the session does not change
while it is read), so the difference is what HTTP adds: the client's and the
gateway's HTTP work and a second hop. ``context`` asks for the OpenAI format
and no recall (no index runs). For each op and path: p50/p99 one request at
a time (latency) and requests/s with ``--concurrency`` requests in flight,
alternating nats and http in each round (nats first in odd rounds) so a slow
moment of a shared machine favours neither. Both clients run in this one
process, which also counts against both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import helpers
import httpx
import services
from rich.table import Table

from bench.benchlib import console, machine_info, percentile, status, warn_if_busy
from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError
from memq.contracts.schemas import Event, Message, TextPart

APP, USER, SESSION = "bench-gw", "u", "s"
KEY = "bench-gateway-key-0123456789"
OPS = ("history", "context")
PATHS = ("nats", "http")
MEMQ = Path(sys.prefix) / "bin" / "memq"
now = time.perf_counter


@dataclass
class Config:
    seconds: float
    rounds: int
    concurrency: int
    events: int


@dataclass
class Run:
    op: str
    path: str
    latency_ms: list[float] = field(default_factory=list)  # one at a time
    requests: int = 0  # with `concurrency` in flight
    busy_s: float = 0.0
    errors: int = 0

    def summary(self) -> dict:
        return dict(
            op=self.op,
            path=self.path,
            p50_ms=percentile(self.latency_ms, 50),
            p99_ms=percentile(self.latency_ms, 99),
            requests_per_s=self.requests / self.busy_s if self.busy_s else 0.0,
            samples=len(self.latency_ms),
            errors=self.errors,
        )


Ask = Callable[[], Awaitable[int]]  # one request; returns how many messages/events came back


def asks(client: MemoryClient, http: httpx.AsyncClient) -> dict[tuple[str, str], Ask]:
    base = f"/v1/apps/{APP}/users/{USER}/sessions/{SESSION}"

    async def nats_history() -> int:
        return len((await client.history(USER, SESSION)).events)

    async def nats_context() -> int:
        return len((await client.context(USER, SESSION, format="openai", recall_limit=0)).messages)

    async def http_history() -> int:
        response = await http.get(f"{base}/history")
        response.raise_for_status()
        return len(response.json()["events"])

    async def http_context() -> int:
        response = await http.get(f"{base}/context", params={"format": "openai", "recall_limit": 0})
        response.raise_for_status()
        return len(response.json()["messages"])

    return {
        ("history", "nats"): nats_history,
        ("context", "nats"): nats_context,
        ("history", "http"): http_history,
        ("context", "http"): http_context,
    }


async def latency(run: Run, ask: Ask, seconds: float, expected: int) -> None:
    deadline = now() + seconds
    while now() < deadline:
        started = now()
        try:
            got = await ask()
        except (MemqError, httpx.HTTPError):
            run.errors += 1
            continue
        run.latency_ms.append((now() - started) * 1000)
        run.errors += got != expected


async def throughput(run: Run, ask: Ask, seconds: float, concurrency: int, expected: int) -> None:
    deadline = now() + seconds

    async def one_at_a_time() -> None:
        while now() < deadline:
            try:
                got = await ask()
            except (MemqError, httpx.HTTPError):
                run.errors += 1
                continue
            run.requests += 1
            run.errors += got != expected

    started = now()
    await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))
    run.busy_s += now() - started


async def measure_paths(
    cfg: Config, table: dict[tuple[str, str], Ask], ops: Sequence[str], paths: Sequence[str]
) -> list[Run]:
    """Every op over every path, latency then throughput, in ``cfg.rounds``
    rounds with each path first in turn; first checks that every path answers
    as many items as the first (NATS), which also warms caches and connections."""
    paths = list(paths)
    expected = {op: await table[op, paths[0]]() for op in ops}
    for op in ops:
        if not expected[op]:
            raise AssertionError(f"{op} over {paths[0]} found nothing: nothing would be measured")
        for path in paths[1:]:
            if (got := await table[op, path]()) != expected[op]:
                raise AssertionError(f"{op}: {path} answered {got} items, {paths[0]} {expected[op]}")
    runs = {(op, path): Run(op, path) for op in ops for path in paths}
    for r in range(cfg.rounds):
        order = paths[r % len(paths) :] + paths[: r % len(paths)]
        for op in ops:
            for path in order:
                status(f"round {r + 1}/{cfg.rounds}: {op} over {path} …")
                await latency(runs[op, path], table[op, path], cfg.seconds, expected[op])
                await throughput(runs[op, path], table[op, path], cfg.seconds, cfg.concurrency, expected[op])
    return list(runs.values())


async def measure(cfg: Config, client: MemoryClient, http: httpx.AsyncClient) -> list[Run]:
    return await measure_paths(cfg, asks(client, http), OPS, PATHS)


async def wait_for_url(path: Path, procs: list[helpers.WorkerProcess], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.is_file() or not path.read_text():
        for p in procs:
            if p.proc is not None and p.proc.poll() is not None:
                raise AssertionError(f"memq worker {p.kind} exited:\n{p.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path} within {timeout}s")
        await asyncio.sleep(0.1)
    return path.read_text().strip()


async def run(cfg: Config, machine: dict, work: Path) -> list[Run]:
    async with AsyncExitStack() as stack:
        status("starting nats-server and the persistence, query and http workers …")
        nats_server = stack.enter_context(services.NatsServer())
        settings = helpers.make_settings(nats_server.url, f"sqlite+aiosqlite:///{work / 'memq.db'}", work)
        env = {
            "MEMQ_HTTP__PORT": "0",
            "MEMQ_HTTP__APPS": json.dumps({APP: {"api_key": KEY}}),
            "MEMQ_CACHE__BACKEND": "memory",
        }
        procs = []
        for kind in ("persistence", "query", "http"):
            proc = helpers.WorkerProcess(settings, work / f"{kind}.log", kind=kind, env=env).start()
            procs.append(proc)
            stack.callback(proc.stop)
            await asyncio.to_thread(proc.wait_ready)  # one at a time: the first migrates the database
        url = await wait_for_url(settings.run_dir / "http.url", procs)
        client = await MemoryClient.connect(nats_server.url, app=APP, consistent=False, timeout=10)
        stack.push_async_callback(client.close)
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, limits=limits, timeout=10)
        stack.push_async_callback(http.aclose)
        turns = [
            Event(
                author=role,
                message=Message(role=role, parts=[TextPart(text=f"{i} " + "memq gateway benchmark " * 13)]),
            )
            for i, role in zip(range(cfg.events), ["user", "assistant"] * cfg.events)
        ]
        seqs = await client.append_many(USER, SESSION, turns)
        await client.history(USER, SESSION, min_seq=seqs[-1])  # committed before anyone reads
        try:
            return await measure(cfg, client, http)
        except BaseException:
            for p in procs:
                console.print(f"[red]memq worker {p.kind} log:[/]\n{p.log_tail()}")
            raise


def overhead(runs: list[Run]) -> list[dict]:
    """What HTTP costs beside NATS, per op: p50 ratio and throughput ratio."""
    by = {(r.op, r.path): r.summary() for r in runs}
    out = []
    for op in OPS:
        nats_, http_ = by[op, "nats"], by[op, "http"]
        out.append(
            dict(
                op=op,
                p50_added_ms=http_["p50_ms"] - nats_["p50_ms"],
                p50_ratio=http_["p50_ms"] / nats_["p50_ms"],
                throughput_ratio=http_["requests_per_s"] / nats_["requests_per_s"] if nats_["requests_per_s"] else 0.0,
            )
        )
    return out


def results_table(runs: list[Run]) -> Table:
    table = Table("op", "path", "p50 ms", "p99 ms", "requests/s", "samples", "errors")
    for r in runs:
        s = r.summary()
        table.add_row(
            s["op"],
            s["path"],
            f"{s['p50_ms']:.3f}",
            f"{s['p99_ms']:.3f}",
            f"{s['requests_per_s']:,.0f}",
            str(s["samples"]),
            str(s["errors"]),
        )
    return table


def print_results(machine: dict, cfg: Config, runs: list[Run]) -> None:
    status(
        f"\n[bold]HTTP gateway[/] — {machine['nproc']} cores ({machine['cpu']}), commit {machine['git']}, "
        f"{cfg.events}-event session, {cfg.rounds} × {cfg.seconds:g} s per measurement, "
        f"{cfg.concurrency} in flight for requests/s"
    )
    console.print(results_table(runs))
    for o in overhead(runs):
        status(
            f"{o['op']}: HTTP adds {o['p50_added_ms']:.3f} ms at p50 ({o['p50_ratio']:.2f}× NATS), "
            f"{o['throughput_ratio']:.2f}× NATS's requests/s"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run: 1 round of 1 s per measurement")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--seconds", type=float, help="each measurement, each round (default 3; --quick 1)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3; --quick 1)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight for requests/s (default 16)")
    parser.add_argument("--events", type=int, default=40, help="events in the session read (default 40)")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> int:
    cfg = Config(
        seconds=args.seconds or (1.0 if args.quick else 3.0),
        rounds=args.rounds or (1 if args.quick else 3),
        concurrency=args.concurrency,
        events=args.events,
    )
    machine = machine_info()
    status(f"[bold]memq HTTP gateway benchmark[/] — {'quick' if args.quick else 'full'} run")
    warn_if_busy(machine)
    with tempfile.TemporaryDirectory(prefix="memq-bench-gateway-") as tmp:
        runs = await run(cfg, machine, Path(tmp))
    print_results(machine, cfg, runs)
    if args.json:
        body = dict(machine=machine, config=asdict(cfg), runs=[r.summary() for r in runs], overhead=overhead(runs))
        args.json.write_text(json.dumps(body, indent=2))
        status(f"wrote {args.json}")
    return 0 if sum(r.errors for r in runs) == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("MEMQ_LOG_LEVEL", "WARNING")
    sys.exit(asyncio.run(main(parse_args())))
