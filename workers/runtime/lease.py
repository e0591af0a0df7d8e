"""A lease: one holder at a time across replicas, freed if the holder dies.

A key in a NATS KV bucket whose entries expire ``ttl_s`` after their last
write. :meth:`Lease.acquire` creates the key only if it does not exist; the
holder re-writes it every ``ttl_s / 3`` (compare-and-set on its revision, so
a lease that expired and was taken by another replica is noticed, not
stolen back); a crashed holder stops writing and the key expires.

Leases of different TTLs share one bucket, whose TTL is set by whoever
created it: a holder renews at a third of the shorter of its own TTL and the
bucket's, so a lease never expires under a live holder whatever TTL came
first (a dead holder's lease then frees after the bucket's TTL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from memq.workers.runtime.bus import patiently

log = logging.getLogger("memq.lease")

BUCKET = "MEMQ_LEASES"


async def lease_bucket(js: JetStreamContext, ttl_s: float, bucket: str = BUCKET, replicas: int = 1):
    """The bucket, created on first use. ``replicas``: as the streams' (R3 in
    a cluster), else losing one node would stop every lease."""
    try:
        return await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=ttl_s,
                storage=StorageType.FILE,
                replicas=replicas,
                description="memq: leases",
            )
        )


class Lease:
    def __init__(self, js: JetStreamContext, key: str, *, ttl_s: float = 30.0, bucket: str = BUCKET, replicas: int = 1):
        self.js, self.key, self.ttl_s, self.bucket, self.replicas = js, key, ttl_s, bucket, replicas
        self.owner = f"{socket.gethostname()}:{os.getpid()}".encode()
        self.revision: int | None = None
        self.renew_s = ttl_s / 3  # or sooner: acquire() reads the bucket's TTL
        self.lost = asyncio.Event()  # set if another holder took over
        self._kv: KeyValue | None = None
        self._keeper: asyncio.Task | None = None

    async def acquire(self) -> bool:
        """Take the lease if free; True if we hold it now."""
        self._kv = await lease_bucket(self.js, self.ttl_s, self.bucket, self.replicas)
        bucket_ttl = (await self._kv.status()).ttl  # None or 0: entries never expire
        self.renew_s = min(self.ttl_s, bucket_ttl or self.ttl_s) / 3
        try:
            self.revision = await self._kv.create(self.key, self.owner)
        except KeyWrongLastSequenceError:
            return False
        self.lost.clear()
        self._keeper = asyncio.create_task(self._keep(), name=f"lease {self.key}")
        return True

    async def wait_acquire(self, poll_s: float = 0.5) -> None:
        """Wait for the lease, and over JetStream being briefly unavailable
        (:func:`memq.workers.runtime.bus.patiently`): a waiter has time to."""
        while not await patiently(f"taking lease {self.key}", self.acquire):
            await asyncio.sleep(poll_s)

    async def _keep(self) -> None:
        kv = self._kv
        assert kv is not None, "started by acquire()"
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                self.revision = await kv.update(self.key, self.owner, last=self.revision)
            except KeyWrongLastSequenceError:
                log.warning("lease %s was lost (expired and taken)", self.key)
                self.lost.set()
                return
            except Exception as exc:  # disconnected: try again; the TTL is the limit
                log.warning("cannot renew lease %s: %s", self.key, exc)

    async def release(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        if self._kv is not None and self.revision is not None and not self.lost.is_set():
            try:
                await self._kv.delete(self.key, last=self.revision)
            except Exception as exc:  # it expires anyway
                log.debug("releasing lease %s: %s", self.key, exc)
        self.revision = None

    async def __aenter__(self) -> Lease:
        await self.wait_acquire()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.release()
