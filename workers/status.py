"""`memq status`: how far behind each worker kind is, which worker instances are
alive, and how many messages wait in the dead-letter stream.

- **Consumers**: every durable consumer of ``MEMQ_EVENTS`` (one per worker
  kind, shared by its replicas) with its lag (``num_pending``: not yet
  delivered), acks pending, redeliveries and ack floor (everything up to it is
  done), beside the stream's last sequence; and its backlog (what waits:
  lag plus acks pending) with an ETA from the rate its ack floor moved at
  while the status was gathered (:func:`backlog_text`).
- **Instances**: workers register as NATS micro services; every instance
  answers ``$SRV.INFO`` and ``$SRV.STATS``. A core request returns only the
  first answer, so :func:`gather` listens on its own inbox for a short while
  and keeps them all.
- **Dead letters**: messages in ``MEMQ_DLQ``, per worker subject.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memq.workers.runtime.event_streams import event_streams
from memq.workers.settings import StreamSettings

DISCOVERY_WAIT_S = 0.3


@dataclass
class ConsumerStatus:
    name: str
    pending: int  # lag: in the stream, not yet delivered to any replica
    ack_pending: int  # delivered, not yet acknowledged
    redelivered: int
    ack_floor: int  # stream sequence up to which every message is acknowledged
    rate: float = 0.0  # messages a second its ack floor moved at while the status was gathered
    eta_s: float | None = None  # how long its backlog takes at that rate (None: none waits, or no progress)

    @property
    def backlog(self) -> int:
        """Messages waiting for this consumer's worker: not delivered, or not acknowledged."""
        return self.pending + self.ack_pending


@dataclass
class Instance:
    name: str
    id: str
    version: str
    description: str = ""
    started: str = ""
    endpoints: int = 0
    requests: int = 0
    errors: int = 0
    avg_ms: float = 0.0  # mean processing time over all requests
    last_error: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # what its endpoints' stats add (the fact worker's figures)


@dataclass
class StreamStatus:
    """An events stream and its durable consumers."""

    stream: str
    last_seq: int | None  # None: the stream does not exist yet
    messages: int | None
    consumers: list[ConsumerStatus]


@dataclass
class Status:
    stream: str  # the shared events stream (all of the log unless apps have streams of their own)
    last_seq: int | None  # None: the stream does not exist yet
    messages: int | None
    consumers: list[ConsumerStatus]
    instances: list[Instance]
    dlq: str
    dlq_messages: int | None
    dlq_by_subject: dict[str, int]
    app_streams: list[StreamStatus] = field(default_factory=list)  # each listed app's own (streams.apps)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for shown, c in zip(out["consumers"], self.consumers, strict=True):
            shown["backlog"] = c.backlog
        for shown_stream, own in zip(out["app_streams"], self.app_streams, strict=True):
            for shown, c in zip(shown_stream["consumers"], own.consumers, strict=True):
                shown["backlog"] = c.backlog
        return out


async def gather(nc: NATS, subject: str, wait_s: float = DISCOVERY_WAIT_S) -> list[dict[str, Any]]:
    """Publish an empty request on ``subject`` and collect every JSON reply
    that arrives within ``wait_s`` (malformed ones are skipped)."""
    replies: list[dict[str, Any]] = []

    async def collect(msg: Msg) -> None:
        try:
            replies.append(orjson.loads(msg.data))
        except orjson.JSONDecodeError:
            pass

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=collect)
    try:
        await nc.publish(subject, b"", reply=inbox)
        await asyncio.sleep(wait_s)
    finally:
        await sub.unsubscribe()
    return replies


async def discover_instances(nc: NATS, wait_s: float = DISCOVERY_WAIT_S) -> list[Instance]:
    """Every live micro-service instance, merged from its INFO and STATS answers."""
    infos, stats = await asyncio.gather(gather(nc, "$SRV.INFO", wait_s), gather(nc, "$SRV.STATS", wait_s))
    instances: dict[str, Instance] = {}
    for info in infos:
        if "id" in info:
            instances[info["id"]] = Instance(
                name=info.get("name", ""),
                id=info["id"],
                version=info.get("version", ""),
                description=info.get("description") or "",
                endpoints=len(info.get("endpoints") or []),
                metadata=info.get("metadata") or {},
            )
    for stat in stats:
        if "id" not in stat:
            continue
        inst = instances.setdefault(stat["id"], Instance(stat.get("name", ""), stat["id"], stat.get("version", "")))
        endpoints = stat.get("endpoints") or []
        inst.started = stat.get("started", "")
        inst.requests = sum(e.get("num_requests", 0) for e in endpoints)
        inst.errors = sum(e.get("num_errors", 0) for e in endpoints)
        busy_ns = sum(e.get("processing_time", 0) for e in endpoints)
        inst.avg_ms = busy_ns / inst.requests / 1e6 if inst.requests else 0.0
        inst.last_error = next((e["last_error"] for e in endpoints if e.get("last_error")), "")
        for e in endpoints:
            if isinstance(e.get("data"), dict):
                inst.data.update(e["data"])
    return sorted(instances.values(), key=lambda i: (i.name, i.started, i.id))


async def read_consumers(js: JetStreamContext, stream: str) -> list[ConsumerStatus]:
    """The stream's durable consumers as they are now (no rate yet)."""
    consumers = []
    for c in await js.consumers_info(stream):
        if c.config.durable_name:  # ephemeral consumers (replays, tools, searches) come and go
            consumers.append(
                ConsumerStatus(
                    name=c.name,
                    pending=c.num_pending or 0,
                    ack_pending=c.num_ack_pending or 0,
                    redelivered=c.num_redelivered or 0,
                    ack_floor=c.ack_floor.stream_seq if c.ack_floor else 0,
                )
            )
    return sorted(consumers, key=lambda c: c.name)


def with_rates(before: list[ConsumerStatus], after: list[ConsumerStatus], seconds: float) -> list[ConsumerStatus]:
    """``after`` with each consumer's rate (how far its ack floor moved since
    ``before``, ``seconds`` earlier) and the ETA of its backlog at that rate."""
    floors = {c.name: c.ack_floor for c in before}
    out = []
    for c in after:
        rate = max(0, c.ack_floor - floors.get(c.name, c.ack_floor)) / seconds if seconds > 0 else 0.0
        eta = c.backlog / rate if c.backlog and rate > 0 else None
        out.append(dataclasses.replace(c, rate=rate, eta_s=eta))
    return out


async def consumers_with_rates(js: JetStreamContext, stream: str, wait_s: float) -> list[ConsumerStatus]:
    """The durable consumers, read twice ``wait_s`` apart for their rates."""
    started = time.monotonic()
    before = await read_consumers(js, stream)
    await asyncio.sleep(max(0.0, wait_s - (time.monotonic() - started)))
    return with_rates(before, await read_consumers(js, stream), time.monotonic() - started)


def duration(seconds: float) -> str:
    """``42s``, ``13 min``, ``2.5 h``: an ETA, as precise as a rate allows."""
    if seconds < 90:
        return f"{max(1, round(seconds))}s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def backlog_text(consumers: list[ConsumerStatus]) -> str:
    """What waits, per consumer with a backlog, with its ETA: ``memq-indexing
    20000 waiting, about 13 min at 25/s``; "" when nothing waits."""
    parts = []
    for c in consumers:
        if not c.backlog:
            continue
        eta = (
            f", about {duration(c.eta_s)} at {c.rate:.0f}/s"
            if c.eta_s is not None
            else ", no ack seen while sampled (replicas ack whole batches)"
        )
        parts.append(f"{c.name} {c.backlog} waiting{eta}")
    return "; ".join(parts)


async def stream_status(js: JetStreamContext, stream: str, wait_s: float) -> StreamStatus:
    """``stream``'s end and its consumers, with their rates over ``wait_s``."""
    try:
        state = (await js.stream_info(stream)).state
        return StreamStatus(stream, state.last_seq, state.messages, await consumers_with_rates(js, stream, wait_s))
    except NotFoundError:
        return StreamStatus(stream, None, None, [])


async def collect_status(nc: NATS, streams: StreamSettings, wait_s: float = DISCOVERY_WAIT_S) -> Status:
    js = nc.jetstream()
    # Discovery waits anyway: let it run while JetStream is asked (twice, for the rates).
    discovery = asyncio.create_task(discover_instances(nc, wait_s))
    shared, *apps = await asyncio.gather(*(stream_status(js, name, wait_s) for name in event_streams(streams)))
    dlq_messages, by_subject = None, {}
    try:
        dlq = await js.stream_info(streams.dlq, subjects_filter=">")
        dlq_messages, by_subject = dlq.state.messages, dict(dlq.state.subjects or {})
    except NotFoundError:
        pass
    return Status(
        stream=shared.stream,
        last_seq=shared.last_seq,
        messages=shared.messages,
        consumers=shared.consumers,
        app_streams=apps,
        instances=await discovery,
        dlq=streams.dlq,
        dlq_messages=dlq_messages,
        dlq_by_subject=by_subject,
    )


def _age(started: str, now: datetime) -> str:
    """How long an instance has run, from its ``started`` (RFC 3339): ``3d 4h``,
    ``5m 2s``; what it says when unparsable."""
    try:
        # NATS gives nanoseconds and a Z; fromisoformat takes microseconds
        head, _, frac = started.rstrip("Z").partition(".")
        since = datetime.fromisoformat(head + (f".{frac[:6]}" if frac else "")).replace(tzinfo=UTC)
    except ValueError:
        return started
    seconds = max(0, int((now - since).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


def _table(title: str) -> Table:
    # Light rules and no padding past one space: an 80-column terminal, or a
    # pipe (which rich gives 80), fits every column without wrapping a name.
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title_justify="left")


def _render_stream(status: StreamStatus, console: Console) -> None:
    if status.last_seq is None:
        console.print(f"[yellow]stream {status.stream} does not exist yet:[/] run `memq init` or start a worker")
        return
    consumers = _table(f"{status.stream}: last seq {status.last_seq}, {status.messages} messages")
    consumers.add_column("consumer", no_wrap=True)
    for column in ("lag", "ack pending", "redelivered", "ack floor"):
        consumers.add_column(column, justify="right", no_wrap=True)
    for c in status.consumers:
        lag = f"[yellow]{c.pending}[/]" if c.pending else "0"
        consumers.add_row(c.name, lag, str(c.ack_pending), str(c.redelivered), str(c.ack_floor))
    if not status.consumers:
        consumers.caption = "no durable consumer yet: no worker has started"
    elif backlog := backlog_text(status.consumers):  # a caption folds; an ETA column broke 80 columns
        consumers.caption = f"backlog: {escape(backlog)}"
    console.print(consumers)


def render(status: Status, console: Console, now: datetime | None = None) -> None:
    """Print one table per section, readable at 80 columns and in a pipe:
    names and numbers are never wrapped; only the last column (what an
    instance serves, its last error) is folded or cut."""
    now = now or datetime.now(UTC)
    shared = StreamStatus(status.stream, status.last_seq, status.messages, status.consumers)
    for stream in (shared, *status.app_streams):
        _render_stream(stream, console)

    instances = _table("worker instances (NATS micro services)")
    instances.add_column("service", no_wrap=True)
    instances.add_column("id", no_wrap=True)  # its last characters tell replicas apart
    instances.add_column("up", no_wrap=True)
    for column in ("requests", "errors", "ms/req"):
        instances.add_column(column, justify="right", no_wrap=True)
    instances.add_column("serves / last error", overflow="fold")
    for i in status.instances:
        errors = f"[red]{i.errors}[/]" if i.errors else "0"
        detail = i.metadata.get("url", "")
        if i.data:
            figures = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in i.data.items() if v is not None)
            detail = f"{detail} {figures}".strip()
        if i.last_error:
            detail = f"{detail} [red]{escape(i.last_error)}[/]".strip()
        instances.add_row(
            i.name.removeprefix("memq-"),
            i.id[-8:],
            _age(i.started, now) if i.started else "",
            str(i.requests),
            errors,
            f"{i.avg_ms:.2f}",
            detail,
        )
    if not status.instances:
        instances.caption = "no instance answered $SRV.INFO"
    console.print(instances)

    if status.dlq_messages is None:
        console.print(f"dead letters: stream {status.dlq} does not exist yet")
        return
    style = "red" if status.dlq_messages else "green"
    console.print(f"dead letters in {status.dlq}: [{style}]{status.dlq_messages}[/]")
    for subject, count in sorted(status.dlq_by_subject.items()):
        console.print(f"  {subject}: {count}")
