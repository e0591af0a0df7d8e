"""The in-process cache tier is bounded by bytes as well as by entries."""

from __future__ import annotations

from memq.workers.query.cache import ENTRY_OVERHEAD, MemoryBackend
from memq.workers.settings import Settings


def size(key: str, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD


async def test_bytes_are_counted_and_the_least_recently_used_go_first():
    value = b"x" * 1000
    one = size("k0", value)
    cache = MemoryBackend(max_entries=1000, max_bytes=3 * one)
    for i in range(3):
        await cache.store(f"k{i}", value, 60)
    assert cache.nbytes == 3 * one
    assert cache.lookup_now([], "k0")[1] == value  # k0 is now the most recently used
    await cache.store("k3", value, 60)
    assert list(cache.entries) == ["k2", "k0", "k3"]  # k1 was the least recently used
    assert cache.nbytes == 3 * one
    # one large entry pushes out as many as it needs, oldest first
    big = b"y" * (2 * one - len("big") - ENTRY_OVERHEAD)
    await cache.store("big", big, 60)
    assert list(cache.entries) == ["k3", "big"]
    assert cache.nbytes == 3 * one == cache.max_bytes


async def test_overwriting_a_key_counts_it_once():
    cache = MemoryBackend(max_bytes=10_000)
    await cache.store("k", b"a" * 100, 60)
    await cache.store("k", b"b" * 300, 60)
    assert cache.nbytes == size("k", b"b" * 300)
    assert len(cache.entries) == 1


async def test_an_entry_larger_than_the_bound_is_not_cached():
    cache = MemoryBackend(max_bytes=2000)
    await cache.store("small", b"s", 60)
    await cache.store("huge", b"h" * 5000, 60)
    assert "huge" not in cache.entries
    assert list(cache.entries) == ["small"]  # and it evicted nothing
    assert cache.nbytes == size("small", b"s")
    # A too-large new answer for a cached key drops the old one as well.
    await cache.store("small", b"h" * 5000, 60)
    assert not cache.entries and cache.nbytes == 0


async def test_the_entry_bound_still_holds_and_clear_resets_the_count():
    cache = MemoryBackend(max_entries=2)
    for i in range(5):
        await cache.store(f"k{i}", b"v", 60)
    assert list(cache.entries) == ["k3", "k4"]
    assert cache.nbytes == 2 * size("k3", b"v")
    cache.clear()
    assert not cache.entries and cache.nbytes == 0


async def test_many_large_replies_stay_within_the_bound():
    """The issue: `memq up` grew to ~600 MB caching large replies."""
    cache = MemoryBackend(max_entries=10_000, max_bytes=4 * 1024 * 1024)
    for i in range(200):
        await cache.store(f"memq:q:e:{i}", bytes(256 * 1024), 60)
    assert cache.nbytes <= 4 * 1024 * 1024
    assert sum(size(k, v) for k, (_, v) in cache.entries.items()) == cache.nbytes


def test_the_setting_reaches_the_query_workers_cache():
    from memq.workers.query.cache import build_cache

    settings = Settings(cache={"backend": "memory", "max_bytes": 123_456})
    assert Settings().cache.max_bytes == 64 * 1024 * 1024
    assert build_cache(settings).local.max_bytes == 123_456
