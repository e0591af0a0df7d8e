"""What `memq up`'s ready line says about the data dir: new, or holding the
events of earlier runs (how many, since when).

The default data dir (``~/.local/share/memq``) is outside any checkout: a new
clone, or a second project, reuses what an earlier one left there. The
ready line says so rather than serve old sessions as if they were new.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from pathlib import Path

from memq.workers.settings import Settings

# What memq keeps in the data dir: the embedded JetStream's store, the SQLite
# database and the embedded index (not memq.toml, which a user may put first).
DATA = ("nats", "memq.db", "index.db")


def is_fresh(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds no memq data yet (missing, or none of :data:`DATA`)."""
    return not any((data_dir / name).exists() for name in DATA)


def data_line(data_dir: Path, fresh: bool, events: int | None, since: datetime | None) -> str:
    """The ready line's data part: the dir, then whether it is new or what it holds."""
    if fresh:
        return f"{data_dir} (new)"
    if not events:
        return f"{data_dir} (no events yet)"
    when = f" since {since.astimezone().strftime('%Y-%m-%d %H:%M')}" if since else ""
    return f"{data_dir} (existing: {events} events{when}; MEMQ_DATA_DIR picks another)"


async def describe_data(settings: Settings, fresh: bool) -> str:
    """:func:`data_line` with the event stream's size and creation time
    (asked of NATS: a SQL server's data dir holds only NATS')."""
    from memq.workers.runtime import bus
    from memq.workers.runtime.event_streams import event_streams

    events = since = None
    with contextlib.suppress(Exception):  # a ready line without counts rather than none
        nc = await bus.open_connection({**bus.connect_options(settings, "up"), "max_reconnect_attempts": 1})
        try:
            js = nc.jetstream(timeout=2)
            infos = [await js.stream_info(stream) for stream in event_streams(settings.streams)]
            events, since = sum(i.state.messages for i in infos), infos[0].created  # the shared one's
        finally:
            await nc.close()
    return data_line(settings.data_dir, fresh, events, since)


async def describe_backlog(settings: Settings, wait_s: float = 1.0) -> str:
    """What waits for each worker kind, with an ETA (:func:`memq.workers.status.backlog_text`):
    a data dir that ``memq up`` opens with a stream full of unindexed events
    (``memq demo --events 20000``) answers searches late, and says so here."""
    from memq.workers.runtime import bus
    from memq.workers.runtime.event_streams import event_streams
    from memq.workers.status import backlog_text, consumers_with_rates

    with contextlib.suppress(Exception):  # a ready line without a backlog rather than none
        nc = await bus.open_connection({**bus.connect_options(settings, "up"), "max_reconnect_attempts": 1})
        try:
            js = nc.jetstream(timeout=2)
            streams = event_streams(settings.streams)
            # Each app's stream has consumers of its own, sampled side by side.
            sampled = await asyncio.gather(*(consumers_with_rates(js, stream, wait_s) for stream in streams))
            texts = [(stream, backlog_text(consumers)) for stream, consumers in zip(streams, sampled, strict=True)]
            return "; ".join(text if len(streams) == 1 else f"{stream}: {text}" for stream, text in texts if text)
        finally:
            await nc.close()
    return ""
