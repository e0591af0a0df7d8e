"""The query cache's invalidation rules, on the in-process tier and on real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from memq.workers.query.cache import Entry, MemoryBackend, QueryCache, RedisBackend


@pytest.fixture(params=["memory", "redis"])
async def cache(request):
    if request.param == "memory":
        c = QueryCache(MemoryBackend(), None, ttl_s=60)
    else:
        url = request.getfixturevalue("redis_server").url
        await aioredis.from_url(url).flushall()
        c = QueryCache(None, RedisBackend(url, ttl_s=60), ttl_s=60)
    yield c
    await c.close()


async def fill(cache: QueryCache, session: str, body: bytes, as_of: int = 1) -> None:
    ticket, entry = await cache.get("app", "u", session, "req")
    assert entry is None
    await cache.put(ticket, Entry(as_of, body))


async def test_a_commit_hides_older_entries_of_its_scopes_only(cache):
    await fill(cache, "s1", b"s1 v1")
    await fill(cache, "s2", b"s2 v1")
    assert (await cache.get("app", "u", "s1", "req"))[1].body == b"s1 v1"

    await cache.invalidate_local("app", "u", "s1", app_state=False, user_state=False)
    await cache.invalidate_shared("app", "u", "s1", app_state=False, user_state=False)
    assert (await cache.get("app", "u", "s1", "req"))[1] is None
    assert (await cache.get("app", "u", "s2", "req"))[1].body == b"s2 v1"  # another session: kept

    await cache.invalidate_local("app", "u", "s1", app_state=True, user_state=False)
    await cache.invalidate_shared("app", "u", "s1", app_state=True, user_state=False)
    assert (await cache.get("app", "u", "s2", "req"))[1] is None  # app state: every session of the app


async def test_a_late_store_under_old_generations_is_never_read(cache):
    ticket, _ = await cache.get("app", "u", "s", "req")  # a miss starts reading SQL …
    await cache.invalidate_local("app", "u", "s", app_state=False, user_state=False)
    await cache.invalidate_shared("app", "u", "s", app_state=False, user_state=False)
    await cache.put(ticket, Entry(1, b"read before the commit"))  # … and stores late
    assert (await cache.get("app", "u", "s", "req"))[1] is None


async def test_lost_counters_never_resurrect_old_entries(cache):
    await fill(cache, "s", b"old")
    ticket, _ = await cache.get("app", "u", "s", "other-req")
    # Counters lost (a Redis restart without persistence, an expiry, a reconnect):
    if cache.local is not None:
        cache.clear_local()
    else:
        for key in await cache.shared.redis.keys("memq:q:g:*"):
            await cache.shared.redis.delete(key)
    await cache.put(ticket, Entry(1, b"stored under the lost counters"))
    for _ in range(3):  # however often it is bumped, a new counter starts above the old ones
        await cache.invalidate_local("app", "u", "s", app_state=False, user_state=False)
        await cache.invalidate_shared("app", "u", "s", app_state=False, user_state=False)
        assert (await cache.get("app", "u", "s", "other-req"))[1] is None


async def test_local_tier_is_filled_from_the_shared_one(redis_server):
    url = redis_server.url
    await aioredis.from_url(url).flushall()
    writer = QueryCache(None, RedisBackend(url, ttl_s=60), ttl_s=60)
    reader = QueryCache(MemoryBackend(), RedisBackend(url, ttl_s=60), ttl_s=60)
    try:
        await fill(writer, "s", b"shared")
        assert (await reader.get("app", "u", "s", "req"))[1].body == b"shared"  # from Redis
        await reader.shared.redis.flushall()
        assert (await reader.get("app", "u", "s", "req"))[1].body == b"shared"  # now from its own tier
    finally:
        await writer.close()
        await reader.close()
