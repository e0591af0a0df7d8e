"""The index's generations as an operator sees them, and dropping the ones
left behind: ``memq index generations`` and ``memq index drop``.

A generation is *live*, *rebuilding* (the unfinished rebuild job's: resumed
by the next ``memq index rebuild``) or *abandoned* (a rebuild killed before
it recorded its job; the next rebuild drops it too).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from memq.workers.index.backends.base import IndexBackend
from memq.workers.indexing.rebuild import REBUILD_LEASE, describe_scope, end_job
from memq.workers.indexing.rebuild_job import JobStore
from memq.workers.runtime.event_streams import event_streams
from memq.workers.runtime.lease import Lease
from memq.workers.settings import Settings


@dataclass
class GenerationRow:
    generation: str
    model: str
    dim: int
    docs: int
    state: str  # live, rebuilding, abandoned
    created_at: float
    note: str = ""  # rebuilding: its scope and how many messages it has left
    min_similarity: float | None = None  # the relevance floor recorded for its model (None: an older generation)


async def list_generations(backend: IndexBackend, js: JetStreamContext, settings: Settings) -> list[GenerationRow]:
    live = await backend.live()
    job = await JobStore(js, replicas=settings.streams.replicas).get()
    rows = []
    for meta in await backend.generations():
        note = ""
        if live is not None and meta.generation == live.generation:
            state = "live"
        elif job is not None and meta.generation == job.generation:
            state = "rebuilding"
            note = describe_scope(job.app, job.user)
            left = None
            for stream in event_streams(settings.streams):
                try:
                    info = await js.consumer_info(stream, job.consumer)
                except NotFoundError:
                    continue
                left = (left or 0) + (info.num_pending or 0) + (info.num_ack_pending or 0)
            if left is not None:
                note += f", {left} messages left"
        else:
            state = "abandoned"
        docs = await backend.count(generation=meta.generation)
        rows.append(
            GenerationRow(
                meta.generation, meta.model, meta.dim, docs, state, meta.created_at, note, meta.min_similarity
            )
        )
    return rows


async def drop_generations(
    backend: IndexBackend, js: JetStreamContext, settings: Settings, names: list[str] | None
) -> list[str]:
    """Drop the named generations (None: every one that is not live). The
    live one cannot be; dropping the rebuilding one ends its job. Refused
    (ValueError) while a rebuild runs: it holds the rebuild lease."""
    ttl_s = settings.indexing.rebuild_lease_ttl_s
    lease = Lease(js, REBUILD_LEASE, ttl_s=ttl_s, replicas=settings.streams.replicas)
    if not await lease.acquire():
        raise ValueError(
            "a rebuild is running (it holds the index-rebuild lease): wait for it, or stop it first "
            f"(a killed one's lease expires within {ttl_s:g}s)"
        )
    try:
        rows = {r.generation: r for r in await list_generations(backend, js, settings)}
        wanted = [g for g, r in rows.items() if r.state != "live"] if names is None else names
        for name in wanted:
            row = rows.get(name)
            if row is None:
                raise ValueError(f"no index generation {name!r}: see `memq index generations`")
            if row.state == "live":
                raise ValueError(f"{name} is the live generation: it is replaced by a rebuild, never dropped")
        store = JobStore(js, replicas=settings.streams.replicas)
        job = await store.get()
        for name in wanted:
            if job is not None and job.generation == name:
                await end_job(store, js, settings, job)
            await backend.drop_generation(name)
        return wanted
    finally:
        await lease.release()
