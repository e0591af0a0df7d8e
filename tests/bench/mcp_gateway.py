"""MCP benchmark: a `search` and a `context` read as an MCP tool call of
`memq mcp` (over stdio and over streamable HTTP) beside the same request over
NATS (`MemoryClient`) and over the HTTP gateway, in the same run.

Usage::

    .venv/bin/python tests/run_bench.py mcp_gateway [--quick] [--json PATH]
        [--seconds S] [--rounds R] [--concurrency C] [--events N]

Everything runs on loopback, on processes this script starts and stops: one
nats-server, a SQLite file, ``memq worker persistence``, ``query``,
``indexing`` (keyword-only: ``indexing.embedder=none``, no model to load) and
``http`` (with an API key for the app), ``memq mcp --transport http`` (the
same key) and ``memq mcp`` on stdio, started by the mcp package's own client
as an assistant starts it. One session of ``--events`` turns is written and
indexed first; then each read is asked again and again, on every path:

- **nats**: ``MemoryClient.search`` (keyword, k=10) / ``MemoryClient.context``
  (OpenAI format, no recall), with ``consistency="any"`` as the gateway and
  the MCP server read;
- **http**: ``GET …/search`` / ``GET …/context`` through the gateway (httpx,
  keep-alive, the API key);
- **mcp-stdio**, **mcp-http**: the ``search_memory`` / ``get_context`` tools
  with the same arguments (the HTTP one with the key).

The measuring (p50/p99 one at a time, requests/s with ``--concurrency`` in
flight, paths alternating in each round) is ``tests/bench/gateway.py``'s.
Every client runs in this one process, which counts against each path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import helpers
import httpx
import httpx2
import services
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from bench.benchlib import console, machine_info, status, warn_if_busy
from bench.gateway import Ask, Config, Run, measure_paths, results_table, wait_for_url
from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError
from memq.contracts.schemas import Event, Message, TextPart

APP, USER, SESSION = "bench-mcp", "u", "s"
KEY = "bench-mcp-key-0123456789"
QUERY, K = "benchmark", 10
OPS = ("search", "context")
PATHS = ("nats", "http", "mcp-stdio", "mcp-http")
MEMQ = Path(sys.prefix) / "bin" / "memq"


def tool(mcp: Client, name: str, arguments: dict[str, Any], items: str) -> Ask:
    """An ask that calls an MCP tool and counts ``items`` of its structured
    reply; a tool error (or a failed call) counts as an error, as a MemqError."""

    async def ask() -> int:
        try:
            result = await mcp.call_tool(name, arguments)
        except Exception as exc:  # the SDK's transport and protocol errors
            raise MemqError(f"{name}: {exc}") from exc
        if result.is_error or result.structured_content is None:
            raise MemqError(f"{name}: {result.content}")
        return len(result.structured_content[items])

    return ask


def asks(client: MemoryClient, http: httpx.AsyncClient, stdio: Client, mcp_http: Client) -> dict[tuple[str, str], Ask]:
    base = f"/v1/apps/{APP}/users/{USER}"

    async def nats_search() -> int:
        return len((await client.search(USER, QUERY, k=K, mode="keyword")).results)

    async def nats_context() -> int:
        return len((await client.context(USER, SESSION, format="openai", recall_limit=0)).messages)

    async def http_search() -> int:
        response = await http.get(f"{base}/search", params={"q": QUERY, "k": K, "mode": "keyword"})
        response.raise_for_status()
        return len(response.json()["results"])

    async def http_context() -> int:
        response = await http.get(f"{base}/sessions/{SESSION}/context", params={"format": "openai", "recall_limit": 0})
        response.raise_for_status()
        return len(response.json()["messages"])

    search_args = {"query": QUERY, "k": K, "mode": "keyword"}
    context_args = {"session": SESSION, "format": "openai", "recall_limit": 0}
    table: dict[tuple[str, str], Ask] = {
        ("search", "nats"): nats_search,
        ("context", "nats"): nats_context,
        ("search", "http"): http_search,
        ("context", "http"): http_context,
    }
    for path, mcp in (("mcp-stdio", stdio), ("mcp-http", mcp_http)):
        table["search", path] = tool(mcp, "search_memory", search_args, "results")
        table["context", path] = tool(mcp, "get_context", context_args, "messages")
    return table


async def mcp_http_url(log_path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The URL on `memq mcp --transport http`'s ready line."""
    deadline = time.monotonic() + timeout
    while not (found := re.search(r"ready: app \S+ on (http://\S+)", log_path.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"memq mcp did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        await asyncio.sleep(0.1)
    return found[1]


async def run(cfg: Config, work: Path) -> list[Run]:
    async with AsyncExitStack() as stack:
        status("starting nats-server, the persistence, query, indexing and http workers, and memq mcp …")
        nats_server = stack.enter_context(services.NatsServer())
        settings = helpers.make_settings(nats_server.url, f"sqlite+aiosqlite:///{work / 'memq.db'}", work)
        env = {
            "MEMQ_HTTP__PORT": "0",
            "MEMQ_HTTP__APPS": json.dumps({APP: {"api_key": KEY}}),
            "MEMQ_CACHE__BACKEND": "memory",
            "MEMQ_INDEXING__EMBEDDER": "none",
        }
        procs = []
        for kind in ("persistence", "query", "indexing", "http"):
            proc = helpers.WorkerProcess(settings, work / f"{kind}.log", kind=kind, env=env).start()
            procs.append(proc)
            stack.callback(proc.stop)
            await asyncio.to_thread(proc.wait_ready)  # one at a time: the first migrates the database
        url = await wait_for_url(settings.run_dir / "http.url", procs)
        mcp_env = {**helpers.settings_env(settings), **env}
        mcp_log = work / "mcp-http.log"
        with open(mcp_log, "ab") as log:
            server = subprocess.Popen(
                [str(MEMQ), "mcp", "--transport", "http", "--port", "0", "--app", APP, "--user", USER],
                env=mcp_env,
                stdout=log,
                stderr=log,
            )
        stack.callback(lambda: (server.terminate(), server.wait(30)))
        mcp_url = await mcp_http_url(mcp_log, server)

        client = await MemoryClient.connect(nats_server.url, app=APP, consistent=False, consistency="any", timeout=10)
        stack.push_async_callback(client.close)
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, limits=limits, timeout=10)
        stack.push_async_callback(http.aclose)
        stdio = await stack.enter_async_context(
            Client(StdioServerParameters(command=str(MEMQ), args=["mcp", "--app", APP, "--user", USER], env=mcp_env))
        )
        keyed = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {KEY}"},
            limits=httpx2.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency),
            timeout=10,
        )
        mcp_http = await stack.enter_async_context(Client(streamable_http_client(mcp_url, http_client=keyed)))

        turns = [
            Event(
                author=role,
                message=Message(role=role, parts=[TextPart(text=f"{i} " + "memq mcp benchmark " * 16)]),
            )
            for i, role in zip(range(cfg.events), ["user", "assistant"] * cfg.events, strict=False)
        ]
        seqs = await client.append_many(USER, SESSION, turns)
        await client.search(USER, QUERY, mode="keyword", min_seq=seqs[-1])  # indexed (and committed) first
        try:
            return await measure_paths(cfg, asks(client, http, stdio, mcp_http), OPS, PATHS)
        except BaseException:
            for p in procs:
                console.print(f"[red]memq worker {p.kind} log:[/]\n{p.log_tail()}")
            console.print(f"[red]memq mcp (http) log:[/]\n{mcp_log.read_text(errors='replace')[-3000:]}")
            raise


def beside_nats(runs: list[Run]) -> list[dict]:
    """Each path's p50 beside NATS's, per op."""
    by = {(r.op, r.path): r.summary() for r in runs}
    return [
        dict(
            op=op,
            path=path,
            p50_added_ms=by[op, path]["p50_ms"] - by[op, "nats"]["p50_ms"],
            p50_ratio=by[op, path]["p50_ms"] / by[op, "nats"]["p50_ms"],
        )
        for op in OPS
        for path in PATHS[1:]
    ]


def print_results(machine: dict, cfg: Config, runs: list[Run]) -> None:
    status(
        f"\n[bold]MCP beside NATS and the HTTP gateway[/] — {machine['nproc']} cores ({machine['cpu']}), "
        f"commit {machine['git']}, {cfg.events}-event session, {cfg.rounds} × {cfg.seconds:g} s per "
        f"measurement, {cfg.concurrency} in flight for requests/s"
    )
    console.print(results_table(runs))
    for o in beside_nats(runs):
        status(f"{o['op']} over {o['path']}: +{o['p50_added_ms']:.3f} ms at p50 ({o['p50_ratio']:.2f}× NATS)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run: 1 round of 1 s per measurement")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--seconds", type=float, help="each measurement, each round (default 3; --quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds, each path first in turn (default 4; --quick 1)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight for requests/s (default 16)")
    parser.add_argument("--events", type=int, default=40, help="events in the session (default 40)")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> int:
    cfg = Config(
        seconds=args.seconds or (1.0 if args.quick else 3.0),
        rounds=args.rounds or (1 if args.quick else 4),
        concurrency=args.concurrency,
        events=args.events,
    )
    machine = machine_info()
    status(f"[bold]memq MCP benchmark[/] — {'quick' if args.quick else 'full'} run")
    warn_if_busy(machine)
    with tempfile.TemporaryDirectory(prefix="memq-bench-mcp-") as tmp:
        runs = await run(cfg, Path(tmp))
    print_results(machine, cfg, runs)
    if args.json:
        body = dict(
            machine=machine, config=asdict(cfg), runs=[r.summary() for r in runs], beside_nats=beside_nats(runs)
        )
        args.json.write_text(json.dumps(body, indent=2))
        status(f"wrote {args.json}")
    return 0 if sum(r.errors for r in runs) == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("MEMQ_LOG_LEVEL", "WARNING")
    sys.exit(asyncio.run(main(parse_args())))
