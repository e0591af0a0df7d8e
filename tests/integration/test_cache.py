"""The query cache's invalidation rules, on the in-process tier and on real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from memq.workers.query.cache import Entry, MemoryBackend, QueryCache, RedisBackend, build_cache
from memq.workers.settings import Settings


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


async def fill_listing(cache: QueryCache, user: str | None, body: bytes) -> None:
    ticket, entry = await cache.get("app", user, None, f"list-{user}", listing=True)
    assert entry is None
    await cache.put(ticket, Entry(1, body))


async def listing(cache: QueryCache, user: str | None) -> bytes | None:
    entry = (await cache.get("app", user, None, f"list-{user}", listing=True))[1]
    return entry.body if entry is not None else None


async def bump(cache: QueryCache, user: str, session: str | None, **flags) -> None:
    for invalidate in (cache.invalidate_local, cache.invalidate_shared):
        await invalidate("app", user, session, **{"app_state": False, "user_state": False, **flags})


async def test_a_page_of_sessions_is_stale_after_any_commit_or_delete_in_its_scope(cache):
    await fill(cache, "s9", b"s9 history")
    await fill_listing(cache, "u", b"u's page")
    await fill_listing(cache, "v", b"v's page")
    await fill_listing(cache, None, b"the app's page")
    assert await listing(cache, "u") == b"u's page"  # a repeated page is a hit

    await bump(cache, "u", "s1", listing=True)  # a commit to one of u's sessions
    assert await listing(cache, "u") is None
    assert await listing(cache, None) is None  # the app's page shows u's sessions too
    assert await listing(cache, "v") == b"v's page"  # another user's page: kept
    assert (await cache.get("app", "u", "s9", "req"))[1].body == b"s9 history"  # u's other sessions: kept

    await fill_listing(cache, None, b"the app's page 2")
    await bump(cache, "v", None, user_state=True, listing=False)  # v's state alone: no session changed
    assert await listing(cache, "v") == b"v's page"
    await bump(cache, "v", None, listing=True)  # v deleted: every session of v goes
    assert await listing(cache, "v") is None
    assert await listing(cache, None) is None

    await fill_listing(cache, "v", b"v's page 3")
    await bump(cache, "v", None, app_state=True, listing=False)  # the app's state: everything in the app
    assert await listing(cache, "v") is None


async def test_the_redis_pool_serves_a_replica_at_max_inflight(redis_server, tmp_path):
    """Every request a replica handles at once reaches Redis (redis-py raises,
    it does not wait, when its pool runs dry: a fixed pool of 64 turned most
    of 256 lookups into errors and SQL reads), while invalidations run."""
    await aioredis.from_url(redis_server.url).flushall()
    settings = Settings(data_dir=tmp_path, cache={"backend": "redis", "redis_url": redis_server.url, "local": False})
    cache = build_cache(settings)
    inflight = settings.query.max_inflight
    try:

        async def request(i: int) -> Entry | None:
            ticket, entry = await cache.get("app", "u", f"s{i}", "req")
            if entry is None:
                await asyncio.sleep(0.01)  # the SQL read, holding its slot as a request does
                await cache.put(ticket, Entry(1, b"answer %d" % i))
            return entry

        async def notices() -> None:
            for i in range(20):
                await cache.invalidate_shared("app", "u", f"other{i}", app_state=False, user_state=False)

        # A first round opens the connections: hundreds of connects at once
        # can pass the 0.5 s connect timeout on a busy machine, which is not
        # what this test is about. Then the pool must serve every request.
        await asyncio.gather(notices(), *(request(i) for i in range(inflight)))
        cache.errors = 0
        await asyncio.gather(notices(), *(request(i) for i in range(inflight, 2 * inflight)))
        hits = await asyncio.gather(notices(), *(request(i) for i in range(inflight, 2 * inflight)))
        assert cache.errors == 0
        assert all(
            entry is not None and entry.body == b"answer %d" % (inflight + i) for i, entry in enumerate(hits[1:])
        )
    finally:
        await cache.close()
