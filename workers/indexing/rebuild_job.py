"""The rebuild job: which generation the indexing fleet replays the stream into.

One rebuild at a time is recorded in the KV bucket ``MEMQ_REBUILD`` under the
key ``job`` (:class:`RebuildJob`); its durable consumer on the event stream
(``memq-rebuild-<generation>``, deliver-all, explicit ack; one of that name on
each events stream) is shared by every
indexing replica and by the ``memq index rebuild`` that started it, as the
live consumer is. The consumer's position is the job's progress, so a killed
replica, CLI or whole stack resumes where it stands. Each replica also
records what it did under ``done.<generation>.<replica>`` (its own key: no
write contention), which is how the fleet's share of the work is seen.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
from dataclasses import asdict, dataclass, field

import orjson
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue

from memq.contracts.subjects import EVENTS_STREAM, EVENTS_WILDCARD
from memq.workers.settings import Settings

log = logging.getLogger("memq.indexing")

BUCKET = "MEMQ_REBUILD"
JOB_KEY = "job"
CONSUMER_PREFIX = "memq-rebuild-"


@dataclass
class RebuildJob:
    generation: str
    model: str
    dim: int
    app: str | None = None  # the scope replayed; None: everything
    user: str | None = None
    copied: int = 0  # docs copied from the live generation (scoped)
    # Scoped: messages outside the scope up to here (by stream: sequences
    # are per stream) are in the copy already.
    copied_upto: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0

    @property
    def consumer(self) -> str:
        return consumer_name(self.generation)

    def __post_init__(self) -> None:
        if isinstance(self.copied_upto, int):  # a job recorded before apps had streams: the shared one's
            self.copied_upto = {EVENTS_STREAM: self.copied_upto}

    def in_scope(self, app: str, user: str) -> bool:
        return (self.app is None or app == self.app) and (self.user is None or user == self.user)


@dataclass
class ReplicaShare:
    """What one replica did for a job."""

    replica: str
    messages: int = 0  # messages acked (applied or skipped)
    docs: int = 0  # docs embedded and written


def consumer_name(generation: str) -> str:
    return CONSUMER_PREFIX + generation


def consumer_config(settings: Settings, generation: str) -> ConsumerConfig:
    """The job's consumer (on each events stream): the whole stream from
    the start, acked as the live consumer acks (a scoped job skips what its copy holds)."""
    s = settings.indexing
    return ConsumerConfig(
        durable_name=consumer_name(generation),
        name=consumer_name(generation),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=s.ack_wait_s,
        max_deliver=-1,  # never give up while the index is down
        max_ack_pending=max(1000, s.batch_size * 8),
        filter_subject=EVENTS_WILDCARD,
    )


def replica_id(kind: str = "indexing") -> str:
    """A name for this replica, unique across hosts and within a process."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40]
    return f"{kind}-{host}-{os.getpid()}-{secrets.token_hex(2)}"


class JobStore:
    """The rebuild job and the replicas' shares, in NATS KV."""

    def __init__(self, js: JetStreamContext, *, replicas: int = 1):
        self.js, self.replicas = js, replicas
        self._kv: KeyValue | None = None

    async def kv(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(BUCKET)
            except (BucketNotFoundError, NotFoundError):
                self._kv = await self.js.create_key_value(
                    KeyValueConfig(
                        bucket=BUCKET,
                        history=1,
                        storage=StorageType.FILE,
                        replicas=self.replicas,
                        description="memq: the index rebuild in progress and each replica's share",
                    )
                )
        return self._kv

    async def get(self) -> RebuildJob | None:
        kv = await self.kv()
        try:
            entry = await kv.get(JOB_KEY)
        except (KeyNotFoundError, NotFoundError):
            return None
        if not entry.value:
            return None
        return RebuildJob(**orjson.loads(entry.value))

    async def put(self, job: RebuildJob) -> None:
        await (await self.kv()).put(JOB_KEY, orjson.dumps(asdict(job)))

    async def close(self, job: RebuildJob) -> None:
        """The job is done or dropped: its record and its shares go."""
        kv = await self.kv()
        current = await self.get()
        if current is not None and current.generation == job.generation:
            await kv.purge(JOB_KEY)
        for key in await self._keys(f"done.{job.generation}."):
            await kv.purge(key)

    async def record(self, generation: str, share: ReplicaShare) -> None:
        await (await self.kv()).put(f"done.{generation}.{share.replica}", orjson.dumps(asdict(share)))

    async def shares(self, generation: str) -> list[ReplicaShare]:
        kv = await self.kv()
        out = []
        for key in await self._keys(f"done.{generation}."):
            try:
                entry = await kv.get(key)
            except (KeyNotFoundError, NotFoundError):
                continue
            if entry.value:
                out.append(ReplicaShare(**orjson.loads(entry.value)))
        return sorted(out, key=lambda s: s.replica)

    async def _keys(self, prefix: str) -> list[str]:
        try:
            keys = await (await self.kv()).keys()
        except NoKeysError:
            return []
        return [k for k in keys if k.startswith(prefix)]
