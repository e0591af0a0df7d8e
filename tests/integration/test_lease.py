"""NATS KV leases on a real 3-node cluster: one holder at a time, and the
bucket is replicated like the streams, so losing a node keeps leases working."""

from __future__ import annotations

import asyncio

import nats

from memq.workers.runtime.lease import Lease


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
