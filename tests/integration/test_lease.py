"""NATS KV leases: one holder at a time; on a real 3-node cluster the
bucket is replicated like the streams, so losing a node keeps leases working."""

from __future__ import annotations

import asyncio

import nats

from memq.workers.runtime.lease import Lease, lease_bucket


async def test_lease_bucket_is_replicated_and_survives_a_node(nats_cluster):
    nc = await nats.connect(servers=nats_cluster.url.split(","))
    js = nc.jetstream(timeout=10)
    first = Lease(js, "k", ttl_s=5, bucket="T_LEASES", replicas=3)
    assert await first.acquire()
    assert (await js.stream_info("KV_T_LEASES")).config.num_replicas == 3
    assert not await Lease(js, "k", ttl_s=5, bucket="T_LEASES", replicas=3).acquire()
    await first.release()

    nats_cluster.nodes[0].kill()  # whichever node led the bucket, two of three remain
    second = Lease(js, "k", ttl_s=5, bucket="T_LEASES", replicas=3)
    for _ in range(50):  # a new leader may take a few seconds to be elected
        try:
            if await second.acquire():
                break
        except Exception:
            pass
        await asyncio.sleep(0.2)
    assert second.revision is not None, "no lease with one node of three down"
    await second.release()
    await nc.close()


async def test_a_lease_outlives_a_shorter_bucket_ttl_while_its_holder_lives(nats_url):
    """Leases of different TTLs share one bucket whose TTL its creator set: a
    30 s lease in a bucket made with 1 s must still be held after 3 s (it
    renews at a third of the bucket's TTL), and free once released."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await lease_bucket(js, ttl_s=1.0, bucket="T_LEASES")  # another kind's, made first
        holder = Lease(js, "job", ttl_s=30.0, bucket="T_LEASES")
        assert await holder.acquire()
        await asyncio.sleep(3.0)
        assert not await Lease(js, "job", ttl_s=30.0, bucket="T_LEASES").acquire(), "expired under a live holder"
        await holder.release()
        taker = Lease(js, "job", ttl_s=30.0, bucket="T_LEASES")
        assert await taker.acquire()
        await taker.release()
    finally:
        await nc.close()
