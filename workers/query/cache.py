"""Read-through cache of query replies, invalidated by commits.

The cache is never a source of truth. Entry keys carry three generation
counters (app, user, session); a commit notice bumps the counters of the
scopes it changed, so older entries are simply never read again (and expire by
TTL). A lookup reads the counters and the entry in one round trip. Each entry
remembers the commit floor it was read at, so a request with ``min_seq`` only
takes entries that already contain that write.

Backends: Redis (shared by replicas) or in-process (``memq up``). A Redis
error is a cache miss, never an error to the caller; invalidations that could
not be written are retried before the next cached answer is trusted.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from memq.contracts.ids import scope_key
from memq.workers import metrics
from memq.workers.settings import QuerySettings, Settings

log = logging.getLogger("memq.cache")

PREFIX = "memq:q"


class Backend(Protocol):
    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]: ...
    async def store(self, key: str, value: bytes, ttl_s: float) -> None: ...
    async def bump(self, gen_keys: Sequence[str]) -> None: ...
    async def close(self) -> None: ...


def _fresh_generation() -> int:
    """A new counter starts at the clock (µs), above any value an earlier
    counter of the same scope reached: entries stored under generations of a
    lost counter (Redis restart, expiry, reconnect) can never match again."""
    return time.time_ns() // 1000


# Bytes an entry costs beyond its key and value: the OrderedDict node, the
# (expiry, value) tuple, the float and the str/bytes object headers (CPython
# 3.11, 64-bit: ~260 measured with tracemalloc over 100k entries).
ENTRY_OVERHEAD = 256


class MemoryBackend:
    """In-process, per replica: LRU-bounded by entry count *and* by bytes.

    :param max_entries: most entries kept (default 10,000).
    :param max_bytes: most bytes of keys and values kept, each entry counted
        as ``len(key) + len(value) + ENTRY_OVERHEAD`` (default 64 MiB); the
        least recently used entries go first. An entry larger than this on
        its own is not cached (it would evict everything else).
    """

    def __init__(self, max_entries: int = 10_000, max_bytes: int = 64 * 1024 * 1024):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0  # what the entries cost now, as counted by _size
        self.gens: dict[str, int] = {}
        self.entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    @staticmethod
    def _size(key: str, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    def _gen(self, key: str) -> int:
        if key not in self.gens:
            self.gens[key] = _fresh_generation()
        return self.gens[key]

    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        return self.lookup_now(gen_keys, entry_prefix)

    def lookup_now(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        suffix = "".join(f":{self._gen(k)}" for k in gen_keys)
        key = entry_prefix + suffix
        hit = self.entries.get(key)
        if hit is None or hit[0] < time.monotonic():
            return suffix, None
        self.entries.move_to_end(key)
        return suffix, hit[1]

    async def store(self, key: str, value: bytes, ttl_s: float) -> None:
        self._discard(key)
        size = self._size(key, value)
        if size > self.max_bytes:
            return  # would push out everything else and still not fit
        self.entries[key] = (time.monotonic() + ttl_s, value)
        self.nbytes += size
        while len(self.entries) > self.max_entries or self.nbytes > self.max_bytes:
            old_key, (_, old_value) = self.entries.popitem(last=False)
            self.nbytes -= self._size(old_key, old_value)

    def _discard(self, key: str) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.nbytes -= self._size(key, old[1])

    def clear(self) -> None:
        """Forget every entry and counter."""
        self.gens.clear()
        self.entries.clear()
        self.nbytes = 0

    async def bump(self, gen_keys: Sequence[str]) -> None:
        for k in gen_keys:
            self.gens[k] = self._gen(k) + 1

    async def close(self) -> None:
        pass


# Reads the generations (starting missing ones at ARGV[2], see
# _fresh_generation) and the entry they name, in one round trip.
_LOOKUP = """
local suffix = ''
for _, k in ipairs(KEYS) do
  local g = redis.call('GET', k)
  if not g then
    g = ARGV[2]
    redis.call('SET', k, g, 'PX', ARGV[3])
  end
  suffix = suffix .. ':' .. g
end
return {suffix, redis.call('GET', ARGV[1] .. suffix)}
"""

_BUMP = """
for _, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 0 then redis.call('SET', k, ARGV[1]) end
  redis.call('INCR', k)
  redis.call('PEXPIRE', k, ARGV[2])
end
"""


def redis_pool_size(max_inflight: int) -> int:
    """Redis connections a query replica can use at once. redis-py raises
    MaxConnectionsError (it does not wait) when its pool runs dry, and a
    request that meets it answers from SQL: so the pool covers every request
    in flight, each holding at most one connection at a time (its Redis calls
    are awaited one after another), plus one for the shared-tier invalidation
    subscriber, which handles one notice at a time. Connections open only
    when needed, so an idle replica holds few."""
    return max_inflight + 1


_DEFAULT_INFLIGHT = QuerySettings().max_inflight


class RedisBackend:
    """Shared by every query replica. (The scripts compute keys, so they need
    a single Redis, or a cluster with the keys in one slot.)

    :param max_connections: the pool's bound; see :func:`redis_pool_size`.
    """

    def __init__(self, url: str, ttl_s: float, max_connections: int = redis_pool_size(_DEFAULT_INFLIGHT)):
        self.redis = aioredis.from_url(
            url, max_connections=max_connections, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        # Counters outlive their entries; an expired one restarts above them.
        self.gen_ttl_ms = int(ttl_s * 2000)
        self._lookup = self.redis.register_script(_LOOKUP)
        self._bump = self.redis.register_script(_BUMP)

    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        suffix, value = await self._lookup(
            keys=list(gen_keys), args=[entry_prefix, _fresh_generation(), self.gen_ttl_ms]
        )
        return suffix.decode(), value

    async def store(self, key: str, value: bytes, ttl_s: float) -> None:
        await self.redis.set(key, value, px=int(ttl_s * 1000))

    async def bump(self, gen_keys: Sequence[str]) -> None:
        await self._bump(keys=list(gen_keys), args=[_fresh_generation(), self.gen_ttl_ms])

    async def close(self) -> None:
        await self.redis.aclose()


@dataclass(frozen=True)
class Entry:
    as_of: int  # commit floor when the answer was read from SQL
    body: bytes


@dataclass(frozen=True)
class Ticket:
    """Where a miss stores its answer: one key per tier, under the
    generations that tier had when the lookup was made."""

    keys: tuple[tuple[Backend, str], ...]


def gen_keys(app: str, user: str | None, session: str | None) -> list[str]:
    keys = [f"{PREFIX}:g:{scope_key(app)}"]
    if user is not None:
        keys.append(f"{PREFIX}:g:{scope_key(app, user)}")
        if session is not None:
            keys.append(f"{PREFIX}:g:{scope_key(app, user, session)}")
    return keys


def listing_gen_keys(app: str, user: str | None) -> list[str]:
    """The counters of a page of sessions (of one user, or of the whole app
    when ``user`` is None): the app's, and the listing's own, which every
    commit or deletion of a session in its scope bumps. A page changes with
    any of its sessions (updated_at orders it), yet its own counter spares
    the cached reads of the other sessions."""
    scope = scope_key(app) if user is None else scope_key(app, user)
    return [f"{PREFIX}:g:{scope_key(app)}", f"{PREFIX}:g:list:{scope}"]


def _to_bump(
    app: str, user: str | None, session: str | None, app_state: bool, user_state: bool, listing: bool
) -> list[str]:
    """The narrowest counter that covers what a commit changed, and with
    ``listing`` the listings that show its sessions (the user's, the app's)."""
    keys = gen_keys(app, user, session)
    if app_state:
        bump = keys[:1]
    elif user_state or session is None:
        bump = keys[1:2]
    else:
        bump = keys[2:3]
    if listing:
        bump += listing_gen_keys(app, None)[1:]
        if user is not None:
            bump += listing_gen_keys(app, user)[1:]
    return bump


def _entry(value: bytes) -> Entry:
    as_of, _, body = value.partition(b"\n")
    return Entry(int(as_of), body)


class QueryCache:
    """Two tiers, both optional: ``local`` in every replica (a hit costs no
    round trip; every replica hears every commit notice) in front of
    ``shared`` (Redis, one for all replicas; one replica bumps it per notice)."""

    def __init__(self, local: MemoryBackend | None, shared: Backend | None, ttl_s: float):
        self.local = local
        self.shared = shared
        self.tiers: tuple[Backend, ...] = tuple(t for t in (local, shared) if t is not None)
        self._local_tiers: tuple[Backend, ...] = (local,) if local is not None else ()
        self.ttl_s = ttl_s
        self._pending: set[str] = set()  # shared-tier bumps that failed
        self.hits = self.misses = self.errors = 0

    @property
    def enabled(self) -> bool:
        return bool(self.tiers)

    async def get(
        self,
        app: str,
        user: str | None,
        session: str | None,
        request_key: str,
        *,
        listing: bool = False,
        shared: bool = True,
    ) -> tuple[Ticket, Entry | None]:
        """``listing``: the request is a page of sessions (of ``user``, or of
        the app), stale after any commit of a session in that scope.
        ``shared=False``: this replica's tier only, for the lookup and for the
        ticket's store."""
        prefix = f"{PREFIX}:e:{request_key}"
        gens = listing_gen_keys(app, user) if listing else gen_keys(app, user, session)
        keys: list[tuple[Backend, str]] = []
        for tier in self.tiers if shared else self._local_tiers:
            try:
                if tier is self.shared and self._pending:
                    # Never trust shared entries while an invalidation is unwritten.
                    await tier.bump(sorted(self._pending))
                    self._pending.clear()
                suffix, value = await tier.lookup(gens, prefix)
            except (RedisError, OSError) as exc:
                self._failed("lookup", exc)
                break
            if value is not None:
                self.hits += 1
                metrics.CACHE_HIT.inc()
                for earlier, key in keys:  # fill the faster tiers
                    await earlier.store(key, value, self.ttl_s)
                return Ticket(tuple(keys)), _entry(value)
            keys.append((tier, prefix + suffix))
        self.misses += 1
        metrics.CACHE_MISS.inc()
        return Ticket(tuple(keys)), None

    def get_local(
        self, app: str, user: str | None, session: str | None, request_key: str, *, listing: bool = False
    ) -> Entry | None:
        """A hit in the in-process tier, without awaiting anything."""
        if self.local is None:
            return None
        gens = listing_gen_keys(app, user) if listing else gen_keys(app, user, session)
        _, value = self.local.lookup_now(gens, f"{PREFIX}:e:{request_key}")
        if value is None:
            return None
        self.hits += 1
        metrics.CACHE_HIT.inc()
        return _entry(value)

    async def put(self, ticket: Ticket, entry: Entry) -> None:
        value = b"%d\n%s" % (entry.as_of, entry.body)
        for tier, key in ticket.keys:
            try:
                await tier.store(key, value, self.ttl_s)
            except (RedisError, OSError) as exc:
                self._failed("store", exc)

    async def invalidate_local(
        self,
        app: str,
        user: str | None,
        session: str | None,
        *,
        app_state: bool,
        user_state: bool,
        listing: bool = True,
    ) -> None:
        """``listing``: sessions may have been committed, created or deleted,
        so the pages of sessions that show them are stale too (False only
        when the caller knows no session changed)."""
        if self.local is not None:
            await self.local.bump(_to_bump(app, user, session, app_state, user_state, listing))

    async def invalidate_shared(
        self,
        app: str,
        user: str | None,
        session: str | None,
        *,
        app_state: bool,
        user_state: bool,
        listing: bool = True,
    ) -> None:
        if self.shared is None:
            return
        bump = _to_bump(app, user, session, app_state, user_state, listing)
        try:
            await self.shared.bump(bump)
        except (RedisError, OSError) as exc:
            self._pending.update(bump)
            self._failed("invalidate", exc)

    def clear_local(self) -> None:
        """After a NATS reconnect notices may have been missed: start afresh
        (new counters start above the old ones)."""
        if self.local is not None:
            self.local.clear()

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        metrics.CACHE_ERRORS.labels(what).inc()
        if self.errors == 1 or self.errors % 1000 == 0:
            log.warning("cache %s failed (%s: %s); answering from SQL", what, type(exc).__name__, exc)

    async def close(self) -> None:
        for tier in self.tiers:
            await tier.close()


def cache_backend(settings: Settings) -> str:
    """``none``, ``memory`` or ``redis``: what ``cache.backend`` comes to."""
    c = settings.cache
    if c.backend == "auto":
        return "redis" if c.redis_url is not None else "memory"
    return c.backend


def build_cache(settings: Settings) -> QueryCache:
    c = settings.cache
    backend = cache_backend(settings)
    if backend == "none":
        return QueryCache(None, None, c.ttl_s)
    local = MemoryBackend(c.max_entries, c.max_bytes) if (backend == "memory" or c.local) else None
    if backend == "redis":
        if c.redis_url is None:
            raise ValueError("cache.backend is redis but MEMQ_CACHE__REDIS_URL is not set")
        pool = redis_pool_size(settings.query.max_inflight)
        return QueryCache(local, RedisBackend(c.redis_url.get_secret_value(), c.ttl_s, pool), c.ttl_s)
    return QueryCache(local, None, c.ttl_s)
