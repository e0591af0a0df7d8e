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

from contracts.ids import scope_key

log = logging.getLogger("memq.cache")

PREFIX = "memq:q"


class Backend(Protocol):
    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]: ...
    async def store(self, key: str, value: bytes, ttl_s: float) -> None: ...
    async def bump(self, gen_keys: Sequence[str]) -> None: ...
    async def close(self) -> None: ...


class MemoryBackend:
    """In-process, for one process (`memq up`). LRU-bounded."""

    def __init__(self, max_entries: int = 10_000):
        self.max_entries = max_entries
        self.gens: dict[str, int] = {}
        self.entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        suffix = "".join(f":{self.gens.get(k, 0)}" for k in gen_keys)
        key = entry_prefix + suffix
        hit = self.entries.get(key)
        if hit is None or hit[0] < time.monotonic():
            return suffix, None
        self.entries.move_to_end(key)
        return suffix, hit[1]

    async def store(self, key: str, value: bytes, ttl_s: float) -> None:
        self.entries[key] = (time.monotonic() + ttl_s, value)
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    async def bump(self, gen_keys: Sequence[str]) -> None:
        for k in gen_keys:
            self.gens[k] = self.gens.get(k, 0) + 1

    async def close(self) -> None:
        pass


# Reads the generations and the entry they name in one round trip.
_LOOKUP = """
local gens = redis.call('MGET', unpack(KEYS))
local suffix = ''
for _, g in ipairs(gens) do suffix = suffix .. ':' .. (g or '0') end
return {suffix, redis.call('GET', ARGV[1] .. suffix)}
"""


class RedisBackend:
    """Shared by every query replica. (The lookup script computes a key, so
    it needs a single Redis or a cluster with the keys in one slot.)"""

    def __init__(self, url: str):
        # A small pool: redis-py 8 raises when its pool (default 100) runs dry.
        self.redis = aioredis.from_url(url, max_connections=64, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._lookup = self.redis.register_script(_LOOKUP)

    async def lookup(self, gen_keys: Sequence[str], entry_prefix: str) -> tuple[str, bytes | None]:
        suffix, value = await self._lookup(keys=list(gen_keys), args=[entry_prefix])
        return suffix.decode(), value

    async def store(self, key: str, value: bytes, ttl_s: float) -> None:
        await self.redis.set(key, value, px=int(ttl_s * 1000))

    async def bump(self, gen_keys: Sequence[str]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for k in gen_keys:
                pipe.incr(k)
            await pipe.execute()

    async def close(self) -> None:
        await self.redis.aclose()


@dataclass(frozen=True)
class Entry:
    as_of: int  # commit floor when the answer was read from SQL
    body: bytes


@dataclass(frozen=True)
class Ticket:
    """What a miss needs to store its answer under the generations it read."""

    key: str


def gen_keys(app: str, user: str | None, session: str | None) -> list[str]:
    keys = [f"{PREFIX}:g:{scope_key(app)}"]
    if user is not None:
        keys.append(f"{PREFIX}:g:{scope_key(app, user)}")
        if session is not None:
            keys.append(f"{PREFIX}:g:{scope_key(app, user, session)}")
    return keys


class QueryCache:
    def __init__(self, backend: Backend | None, ttl_s: float):
        self.backend = backend
        self.ttl_s = ttl_s
        self._pending: set[str] = set()  # generation bumps Redis missed
        self.hits = self.misses = self.errors = 0

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    async def get(
        self, app: str, user: str | None, session: str | None, request_key: str
    ) -> tuple[Ticket | None, Entry | None]:
        if self.backend is None:
            return None, None
        try:
            if self._pending:  # never trust entries while an invalidation is unwritten
                await self.backend.bump(sorted(self._pending))
                self._pending.clear()
            prefix = f"{PREFIX}:e:{request_key}"
            suffix, value = await self.backend.lookup(gen_keys(app, user, session), prefix)
        except (RedisError, OSError) as exc:
            self._failed("lookup", exc)
            return None, None
        if value is None:
            self.misses += 1
            return Ticket(prefix + suffix), None
        self.hits += 1
        as_of, _, body = value.partition(b"\n")
        return Ticket(prefix + suffix), Entry(int(as_of), body)

    async def put(self, ticket: Ticket | None, entry: Entry) -> None:
        if self.backend is None or ticket is None:
            return
        try:
            await self.backend.store(ticket.key, b"%d\n%s" % (entry.as_of, entry.body), self.ttl_s)
        except (RedisError, OSError) as exc:
            self._failed("store", exc)

    async def invalidate(self, app: str, user: str | None, session: str | None, *, app_state: bool, user_state: bool) -> None:
        """A commit changed these scopes: bump the narrowest counter that covers them."""
        if self.backend is None:
            return
        keys = gen_keys(app, user, session)
        if app_state:
            bump = keys[:1]
        elif user_state or session is None:
            bump = keys[1:2]
        else:
            bump = keys[2:3]
        try:
            await self.backend.bump(bump)
        except (RedisError, OSError) as exc:
            self._pending.update(bump)
            self._failed("invalidate", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 1000 == 0:
            log.warning("cache %s failed (%s: %s); answering from SQL", what, type(exc).__name__, exc)

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()
