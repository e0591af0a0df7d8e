"""The embedded index: one SQLite file, FTS5 for BM25 and numpy for vectors.

What ``memq up`` uses when no Weaviate is configured. It needs only the
standard library's ``sqlite3`` (with FTS5, compiled into every CPython build
we know of) and numpy: no SQLite extension is loaded, because many Pythons
(this machine's included) cannot load one.

Layout of the file:

- ``generations`` (id, name, model, dim, created_at, min_similarity: the
  relevance floor recorded for its model, NULL in a file from before issue
  41, whose generations then take their model's) and a one-row ``live``
  pointer. Generation ``g<n>`` owns the tables ``docs_<n>`` and ``fts_<n>``.
- ``docs_<n>``: one row per :class:`~memq.workers.memory.recall.Doc`, keyed by its
  uuid, with the vector as a float32 little-endian BLOB (empty in a
  keyword-only generation, ``dim`` 0: ``indexing.embedder = "none"``).
- ``fts_<n>``: an *external-content* FTS5 index over ``docs_<n>``'s
  ``search_text``, ``user_key`` and ``session_key`` (sha256 hex digests: one
  token each), kept in sync by triggers. Tokens are Porter-stemmed, so
  "research" finds "researching" (on LoCoMo dev that took multi-hop
  recall@10 from ~0.48 to ~0.53); a generation created before keeps its
  tokenizer until ``memq index rebuild``. A generation created now also
  indexes a ``grams`` column (:mod:`memq.workers.index.grams`: bigrams of
  Chinese, Japanese, Korean, Thai… text, '' for other text), so a word
  inside unspaced text is found; its tokenizer keeps combining marks in
  words (a Thai vowel sign stays in its bigram). Older generations lack the
  column and keep working without it until a rebuild. Stemming a 64-hex-digit key can
  only drop a final "e" or "ed", so two keys never become one token in
  practice (the first 62 digits would have to agree). A keyword search MATCHes the scope's
  token AND its words, so FTS5 intersects posting lists and never scores
  other users' docs (filtering after the MATCH made a small user's search in
  a shared file ~20x slower). External content rather than contentless: the
  text is stored once, triggers update the index inside the writing
  transaction whatever SQL changes ``docs_<n>``, and ``INSERT INTO
  fts_<n>(fts_<n>) VALUES('rebuild')`` can always regenerate it from
  ``docs_<n>`` (contentless tables need the old text for every delete too,
  and cannot be rebuilt from themselves).
- ``versions`` (generation, user_key, version, deleted): bumped by every
  write or delete of that user's docs, so a process caching a user's vectors
  sees other processes' writes; each doc row records the version that wrote
  it, so a stale cache reads only the rows written since (unless a delete
  happened: then it reloads).

Several processes share the file (indexing worker, query worker, ``memq
index rebuild``): WAL mode lets readers run alongside the one writer, a busy
timeout makes writers queue instead of failing, and transactions stay short.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
import unicodedata
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from memq.contracts.ids import scope_key
from memq.workers.index.backends.base import IndexMeta, IndexUnavailable, UnknownGeneration
from memq.workers.index.grams import grams as grams_of
from memq.workers.index.grams import query_terms
from memq.workers.memory.recall import (
    CONTEXT_WEIGHT,
    Doc,
    Hit,
    SearchQuery,
    relative_score_fusion,
    split_search_text,
)

T = TypeVar("T")

APPLICATION_ID = 0x6D656D71  # "memq": PRAGMA application_id marks the file as ours
SCHEMA_VERSION = 1  # PRAGMA user_version
WRITE_CHUNK = 500  # docs per write transaction: the write lock is held briefly
MAX_QUERY_TOKENS = 256  # a pasted essay as a query must not become a 5,000-term OR
_WORD = re.compile(r"[^\W_]+")  # letters/digits, split like unicode61 splits ("_" separates)
# Weaviate's default stopword preset ("en"), which its BM25 ignores: left out
# of queries here too, so both backends rank alike (and "the" does not make
# FTS5 score nearly every row).
STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    }
)
_COLS = ("rid", "doc_id", "app", '"user"', "session", "seq", "author", "role", "timestamp", "text", "search_text")
_MATRIX_COLS = "rid, session, author, role, timestamp, vector"


def _cols(gen: _Gen, alias: str = "") -> str:
    """The columns a Doc is read from (:func:`_row_doc`), of table ``alias``;
    a generation that keeps the previous turn apart gives the whole
    search_text back."""
    at = f"{alias}." if alias else ""
    cols = [f"{at}{c}" for c in _COLS]
    if gen.context:
        cols[-1] = f"{at}search_text || {at}context"
    return ", ".join(cols)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: table names and cache keys stay unique
    name TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    dim INTEGER NOT NULL,
    created_at REAL NOT NULL,
    min_similarity REAL  -- the relevance floor of its model's vectors (NULL in an older file: the model's)
);
CREATE TABLE IF NOT EXISTS live (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    generation INTEGER REFERENCES generations (id)
);
INSERT OR IGNORE INTO live (one, generation) VALUES (1, NULL);
CREATE TABLE IF NOT EXISTS versions (
    generation INTEGER NOT NULL,
    user_key TEXT NOT NULL,
    version INTEGER NOT NULL,  -- bumped by every write of the user's docs
    deleted INTEGER NOT NULL,  -- the version of the user's last delete
    PRIMARY KEY (generation, user_key)
) WITHOUT ROWID;
"""

# One generation. rid is an explicit INTEGER PRIMARY KEY because the FTS index
# refers to it and VACUUM may renumber an implicit rowid; uuid is the doc's key.
# {extra_cols}/{fts_cols}/...: a generation created now also indexes
# ``grams`` (grams.py: bigrams of unspaced scripts, '' for other text), with
# combining marks as part of words (Thai vowel signs stay in their bigram),
# and keeps the previous turn apart (``context`` and its ``context_grams``): search_text then holds the turn's own text only,
# and a read gives back ``search_text || context``, the doc's search_text.
_GENERATION_SCHEMA = """
CREATE TABLE docs_{n} (
    rid INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    doc_id TEXT NOT NULL,
    app TEXT NOT NULL,
    "user" TEXT NOT NULL,
    session TEXT NOT NULL,
    user_key TEXT NOT NULL,
    session_key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    author TEXT NOT NULL,
    role TEXT NOT NULL,
    timestamp REAL NOT NULL,
    text TEXT NOT NULL,
    search_text TEXT NOT NULL,
    vector BLOB NOT NULL,
    version INTEGER NOT NULL{extra_cols}  -- version: the user's version that wrote the row
);
CREATE INDEX docs_{n}_user ON docs_{n} (user_key, seq);
CREATE INDEX docs_{n}_session ON docs_{n} (session_key, seq);
CREATE INDEX docs_{n}_changes ON docs_{n} (user_key, version);
CREATE VIRTUAL TABLE fts_{n} USING fts5(
    {fts_cols},
    content='docs_{n}', content_rowid='rid', tokenize="{tokenizer}"
);
CREATE TRIGGER docs_{n}_ai AFTER INSERT ON docs_{n} BEGIN
    INSERT INTO fts_{n} (rowid, {fts_cols})
    VALUES (new.rid, {new_vals});
END;
CREATE TRIGGER docs_{n}_ad AFTER DELETE ON docs_{n} BEGIN
    INSERT INTO fts_{n} (fts_{n}, rowid, {fts_cols})
    VALUES ('delete', old.rid, {old_vals});
END;
-- The keys never change for a uuid; a redelivered doc (same text) leaves the FTS index alone.
CREATE TRIGGER docs_{n}_au AFTER UPDATE OF {texts} ON docs_{n}
WHEN {changed} BEGIN
    INSERT INTO fts_{n} (fts_{n}, rowid, {fts_cols})
    VALUES ('delete', old.rid, {old_vals});
    INSERT INTO fts_{n} (rowid, {fts_cols})
    VALUES (new.rid, {new_vals});
END;
"""
_TOKENIZER = "porter unicode61 remove_diacritics 2"
_GRAMS_TOKENIZER = "porter unicode61 remove_diacritics 2 categories 'L* N* Co M*'"
_GRAMS_COLS = ("grams",)
_CONTEXT_COLS = ("grams", "context", "context_grams")


def generation_schema(n: int, grams: bool, context: bool | None = None) -> str:
    """The tables of generation ``n``; ``grams``: with the grams column;
    ``context`` (default: as ``grams``): with the previous turn in columns
    of its own (new generations have both)."""
    context = grams if context is None else context
    if context and not grams:
        raise ValueError("a generation with context columns has the grams column too")
    extra = _CONTEXT_COLS if context else _GRAMS_COLS if grams else ()
    texts = ("search_text", *extra)
    cols = ("search_text", "user_key", "session_key", *extra)
    return _GENERATION_SCHEMA.format(
        n=n,
        extra_cols="".join(f",\n    {c} TEXT NOT NULL DEFAULT ''" for c in extra),
        fts_cols=", ".join(cols),
        new_vals=", ".join(f"new.{c}" for c in cols),
        old_vals=", ".join(f"old.{c}" for c in cols),
        texts=", ".join(texts),
        changed=" OR ".join(f"old.{c} IS NOT new.{c}" for c in texts),
        tokenizer=_GRAMS_TOKENIZER if grams else _TOKENIZER,
    )


# INSERT ... ON CONFLICT DO UPDATE rather than INSERT OR REPLACE: REPLACE's
# implicit delete fires no delete trigger (unless recursive_triggers is on),
# which would leave the old text in the FTS index.
_UPSERT = """
INSERT INTO docs_{n} (uuid, doc_id, app, "user", session, user_key, session_key, seq, author, role,
                      timestamp, text, search_text, vector, version{extra_cols})
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?{extra_args})
ON CONFLICT (uuid) DO UPDATE SET
    doc_id = excluded.doc_id, app = excluded.app, "user" = excluded."user", session = excluded.session,
    user_key = excluded.user_key, session_key = excluded.session_key, seq = excluded.seq,
    author = excluded.author, role = excluded.role, timestamp = excluded.timestamp,
    text = excluded.text, search_text = excluded.search_text, vector = excluded.vector, version = excluded.version{extra_set}
"""


def upsert_sql(n: int, grams: bool, context: bool = False) -> str:
    extra = _CONTEXT_COLS if context else _GRAMS_COLS if grams else ()
    return _UPSERT.format(
        n=n,
        extra_cols="".join(f", {c}" for c in extra),
        extra_args=", ?" * len(extra),
        extra_set="".join(f", {c} = excluded.{c}" for c in extra),
    )


def match_expression(text: str, grams: bool = False) -> str | None:
    """The FTS5 MATCH expression for free ``text``: its words but
    :data:`STOPWORDS`, each a quoted string, OR-ed; None when none is left.
    ``grams`` (a generation with the grams column): a word in an unspaced
    script as its bigrams (:func:`~memq.workers.index.grams.query_terms`).

    A quoted string is only ever text to FTS5, and the words hold letters and
    digits only (no ``"`` to escape), so ``AND``, ``NEAR(…)``, ``*``, ``:``,
    ``-`` or quotes in user text can neither raise nor change the query.
    """
    found = query_terms(text) if grams else _WORD.findall(unicodedata.normalize("NFC", text).lower())
    words = dict.fromkeys(w for w in found if w not in STOPWORDS)
    return " OR ".join(f'"{w}"' for w in list(words)[:MAX_QUERY_TOKENS]) or None


@dataclass(frozen=True)
class _Gen:
    id: int
    name: str
    model: str
    dim: int
    created_at: float
    min_similarity: float | None = None
    grams: bool = False  # its docs and FTS index have the grams column
    context: bool = False  # ... and the previous turn's columns (search_text is the turn's own text)

    @property
    def meta(self) -> IndexMeta:
        return IndexMeta(self.name, self.model, self.dim, self.created_at, self.min_similarity)


class _Matrix:
    """One user's vectors in one generation as of ``version``: unit rows in
    rid order, with what vector filters need (session, author and role as
    integer codes, so a filter is a vectorised compare, not a string loop)."""

    def __init__(self, dim: int):
        self.version = 0
        self.rids = np.empty(0, np.int64)
        self.vectors = np.empty((0, dim), np.float32)
        self.timestamps = np.empty(0, np.float64)
        self.codes = np.empty((0, 3), np.int32)  # session, author, role
        self.labels: tuple[dict[str, int], ...] = ({}, {}, {})  # their code of each string

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes + self.rids.nbytes + self.timestamps.nbytes + self.codes.nbytes

    def apply(self, version: int, rows: list[tuple]) -> bool:
        """Take in ``rows`` (``_MATRIX_COLS``) written since ``self.version``:
        overwrite the rids known, append the others. False if a new rid is
        not past the known ones (SQLite gives a new row the highest rowid
        yet, so only a delete could cause it): the caller then loads afresh."""
        rows = sorted(rows)  # by rid
        n, dim = len(rows), self.vectors.shape[1]
        rids = np.fromiter((r[0] for r in rows), np.int64, n)
        vectors = np.frombuffer(b"".join(r[5] for r in rows), "<f4").reshape(n, dim)
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))[:, None]
        vectors = vectors / np.where(norms > 0, norms, 1.0).astype(np.float32)  # cosine = dot of unit rows
        timestamps = np.fromiter((r[4] for r in rows), np.float64, n)
        codes = np.empty((n, 3), np.int32)
        for c, labels in enumerate(self.labels):
            codes[:, c] = np.fromiter((labels.setdefault(r[1 + c], len(labels)) for r in rows), np.int32, n)
        pos = np.searchsorted(self.rids, rids)
        known = pos < len(self.rids)
        known[known] = self.rids[pos[known]] == rids[known]
        new = ~known
        if new.any() and len(self.rids) and rids[new][0] <= self.rids[-1]:
            return False
        at = pos[known]
        self.vectors[at], self.timestamps[at], self.codes[at] = vectors[known], timestamps[known], codes[known]
        if new.any():
            self.rids = np.concatenate([self.rids, rids[new]])
            self.vectors = np.concatenate([self.vectors, vectors[new]])
            self.timestamps = np.concatenate([self.timestamps, timestamps[new]])
            self.codes = np.concatenate([self.codes, codes[new]])
        self.version = version
        return True

    def mask(self, q: SearchQuery) -> np.ndarray | None:
        """Rows passing the query's session/author/role/time filters (None: all)."""

        def among(column: int, wanted: Sequence[str]) -> np.ndarray:
            labels = self.labels[column]
            return np.isin(self.codes[:, column], [labels[w] for w in wanted if w in labels])

        m = None
        for part in (
            among(0, [q.session]) if q.session is not None else None,
            among(1, q.authors) if q.authors else None,
            among(2, q.roles) if q.roles else None,
            self.timestamps >= q.since if q.since is not None else None,
            self.timestamps < q.until if q.until is not None else None,
        ):
            if part is not None:
                m = part if m is None else m & part
        return m


class EmbeddedIndex:
    """The embedded :class:`~memq.workers.index.backends.base.IndexBackend`.

    :param path: the SQLite file (created, with its directory, if missing).
    :param busy_timeout_s: how long a write waits for another process's write
        transaction before failing with :class:`IndexUnavailable`; default 5.
    :param cache_mb: budget of the in-process cache of users' vector matrices
        (least recently used first out); default 256.
    :param page_size: docs per read transaction in :meth:`export`; default 1000.

    SQLite calls are blocking, so every one runs on a dedicated single thread
    that owns the connection: the event loop never waits on disk or locks.
    """

    name = "embedded"

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0, cache_mb: int = 256, page_size: int = 1000):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.cache_bytes = cache_mb * 1024 * 1024
        self.page_size = page_size
        self._pool: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None  # used only on the pool's thread
        self._cache: OrderedDict[tuple[int, str], _Matrix] = OrderedDict()  # ditto
        self._columns: dict[int, tuple[bool, bool]] = {}  # generation id -> (grams, context) (ids are never reused)

    # --- plumbing ---------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            raise RuntimeError("EmbeddedIndex: call open() first")
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(self._guarded, fn, *args))

    def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except sqlite3.ProgrammingError:
            raise
        except sqlite3.DatabaseError as exc:  # locked past the timeout, corrupt, I/O error, disk full
            raise IndexUnavailable(f"embedded index {self.path}: {exc}") from exc

    @property
    def _conn(self) -> sqlite3.Connection:
        """The connection, which only code that _run() calls after open() uses."""
        if self._db is None:
            raise RuntimeError("EmbeddedIndex: call open() first")
        return self._db

    def _tx(self, write: bool = False) -> _Transaction:
        """A transaction on the connection. Writes take the write lock up front
        (IMMEDIATE): a read that later upgrades could fail with SQLITE_BUSY."""
        return _Transaction(self._conn, "IMMEDIATE" if write else "DEFERRED")

    @overload
    def _gen(self, name: str) -> _Gen: ...
    @overload
    def _gen(self, name: str | None) -> _Gen | None: ...

    def _gen(self, name: str | None) -> _Gen | None:
        """The named generation (UnknownGeneration if there is none), or the live one
        (None if nothing was promoted). Call inside a transaction, so what it
        returns cannot be dropped before the transaction ends."""
        cols = "g.id, g.name, g.model, g.dim, g.created_at, g.min_similarity"
        if name is None:
            row = self._conn.execute(f"SELECT {cols} FROM live JOIN generations g ON g.id = live.generation").fetchone()
            return self._with_grams(_Gen(*row)) if row else None
        row = self._conn.execute(f"SELECT {cols} FROM generations g WHERE g.name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownGeneration(f"no index generation {name!r} in {self.path}")
        return self._with_grams(_Gen(*row))

    def _with_grams(self, gen: _Gen) -> _Gen:
        """``gen`` knowing whether its tables have the grams column (a
        generation created before grams were indexed has not, until a rebuild) and
        the previous turn's columns (one created before turns kept it apart has not)."""
        has = self._columns.get(gen.id)
        if has is None:
            cols = {r[0] for r in self._conn.execute(f"SELECT name FROM pragma_table_info('docs_{gen.id}')")}
            has = self._columns[gen.id] = ("grams" in cols, "context" in cols)
        return replace(gen, grams=has[0], context=has[1])

    def _write_gen(self, name: str | None) -> _Gen:
        gen = self._gen(name)
        if gen is None:
            raise IndexUnavailable(f"embedded index {self.path} has no live generation (create and promote one)")
        return gen

    def _bump(self, gen: _Gen, user_keys: set[str], *, deleted: bool = False) -> dict[str, int]:
        """Move each user's version on (every process's cache of the user is
        then stale) and return the new versions. ``deleted``: record a
        delete, after which caches reload in full."""
        out = {}
        for uk in user_keys:
            self._conn.execute(
                "INSERT INTO versions (generation, user_key, version, deleted) VALUES (?, ?, 1, ?)"
                " ON CONFLICT (generation, user_key) DO UPDATE SET"
                " version = version + 1, deleted = CASE WHEN ? THEN version + 1 ELSE deleted END",
                (gen.id, uk, int(deleted), deleted),
            )
            out[uk] = self._conn.execute(
                "SELECT version FROM versions WHERE generation = ? AND user_key = ?", (gen.id, uk)
            ).fetchone()[0]
        return out

    # --- lifecycle ----------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memq-index")
        try:
            await self._run(self._open)
        except BaseException:
            await self.close()
            raise

    def _open(self) -> None:
        if self._db is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IndexUnavailable(f"embedded index {self.path}: {exc}") from exc
        if sqlite3.sqlite_version_info < (3, 24, 0):  # INSERT ... ON CONFLICT DO UPDATE
            raise IndexUnavailable(f"the embedded index needs SQLite >= 3.24; this Python has {sqlite3.sqlite_version}")
        db = sqlite3.connect(self.path, isolation_level=None)  # autocommit: transactions are explicit
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            app_id = db.execute("PRAGMA application_id").fetchone()[0]  # reads the header: a bad file fails here
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if app_id not in (0, APPLICATION_ID):
                raise IndexUnavailable(f"{self.path} is not a memq index (application_id {app_id:#x})")
            if version > SCHEMA_VERSION:
                raise IndexUnavailable(
                    f"{self.path} has index schema {version}, newer than this memq's {SCHEMA_VERSION}"
                )
            db.execute("PRAGMA journal_mode = WAL")
            # FULL: a commit is on disk when upsert returns, so the worker may ack.
            db.execute("PRAGMA synchronous = FULL")
            with _Transaction(db, "IMMEDIATE"):
                _script(db, _SCHEMA)
                # A file older than the recorded floor: its generations record none (NULL: their model's).
                if "min_similarity" not in {
                    r[0] for r in db.execute("SELECT name FROM pragma_table_info('generations')")
                }:
                    db.execute("ALTER TABLE generations ADD COLUMN min_similarity REAL")
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            db.close()
            raise
        self._db = db

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        await asyncio.get_running_loop().run_in_executor(pool, self._close)
        pool.shutdown(wait=True)

    def _close(self) -> None:
        db, self._db = self._db, None
        self._cache.clear()
        if db is not None:
            db.close()

    # --- generations ----------------------------------------------------------------

    async def live(self) -> IndexMeta | None:
        gen = await self._run(self._read, lambda: self._gen(None))
        return gen.meta if gen else None

    async def generations(self) -> list[IndexMeta]:
        rows = await self._run(
            self._read,
            lambda: self._conn.execute(
                "SELECT id, name, model, dim, created_at, min_similarity FROM generations ORDER BY id"
            ).fetchall(),
        )
        return [_Gen(*r).meta for r in rows]

    async def create_generation(self, model: str, dim: int, *, min_similarity: float | None = None) -> IndexMeta:
        """A new empty generation ``g<n>`` (not live) for vectors of ``model``
        with ``dim`` dimensions; ``dim`` 0: keyword-only, docs without vectors."""
        if dim < 0:
            raise ValueError(f"dim must not be negative, got {dim}")
        return (await self._run(self._create_generation, model, dim, min_similarity)).meta

    def _create_generation(self, model: str, dim: int, min_similarity: float | None) -> _Gen:
        with self._tx(write=True):
            n = self._conn.execute(
                "INSERT INTO generations (name, model, dim, created_at, min_similarity) VALUES ('', ?, ?, ?, ?)",
                (model, dim, time.time(), min_similarity),
            ).lastrowid
            assert n is not None  # an INSERT's rowid
            self._conn.execute("UPDATE generations SET name = 'g' || id WHERE id = ?", (n,))
            _script(self._conn, generation_schema(n, grams=True))
            return self._gen(f"g{n}")

    async def promote(self, generation: str) -> None:
        """Point ``live`` at ``generation`` and drop the previous live
        generation's tables, in one transaction: readers see either the old
        index or the new one, never a mix or nothing. A read transaction
        begun before keeps its snapshot (WAL); a later read that names the
        old generation gets :class:`UnknownGeneration`, on which the
        searcher reads the live one (:meth:`memq.workers.query.search.Searcher.hits`)."""
        await self._run(self._promote, generation)

    def _promote(self, name: str) -> None:
        with self._tx(write=True):
            new, old = self._gen(name), self._gen(None)
            if old is not None and old.id == new.id:
                return
            self._conn.execute("UPDATE live SET generation = ? WHERE one = 1", (new.id,))
            if old is not None:
                self._drop(old)

    async def drop_generation(self, generation: str) -> None:
        """Delete a generation that is not live; an unknown name is a no-op
        (so a retried cleanup converges). Dropping the live one raises ValueError."""
        await self._run(self._drop_generation, generation)

    def _drop_generation(self, name: str) -> None:
        with self._tx(write=True):
            try:
                gen = self._gen(name)
            except UnknownGeneration:
                return
            live = self._gen(None)
            if live is not None and live.id == gen.id:
                raise ValueError(f"generation {name!r} is live: promote another one instead of dropping it")
            self._drop(gen)

    def _drop(self, gen: _Gen) -> None:
        # The triggers and indexes go with their table; the FTS shadow tables with fts_<n>.
        self._conn.execute(f"DROP TABLE IF EXISTS fts_{gen.id}")
        self._conn.execute(f"DROP TABLE IF EXISTS docs_{gen.id}")
        self._conn.execute("DELETE FROM versions WHERE generation = ?", (gen.id,))
        self._conn.execute("DELETE FROM generations WHERE id = ?", (gen.id,))
        for key in [k for k in self._cache if k[0] == gen.id]:
            del self._cache[key]

    # --- writes ---------------------------------------------------------------------

    async def upsert(self, docs: Sequence[Doc], *, generation: str | None = None, rewrite: bool = False) -> None:
        """Insert or overwrite ``docs`` by uuid, in transactions of at most
        ``WRITE_CHUNK`` docs. A doc without a vector (in a generation with
        vectors), or with one of another dimension than the generation's,
        raises ValueError; a keyword-only generation takes docs without one.
        ``rewrite`` changes nothing here: a transaction is never half-applied."""
        for i in range(0, len(docs), WRITE_CHUNK):
            await self._run(self._upsert, docs[i : i + WRITE_CHUNK], generation)

    def _upsert(self, docs: Sequence[Doc], name: str | None) -> None:
        rows = [_doc_row(d) for d in docs]  # before taking the write lock
        with self._tx(write=True):
            gen = self._write_gen(name)  # resolved under the write lock: no promote can slip in between
            for d, row in zip(docs, rows, strict=True):
                if d.vector is None and gen.dim:
                    raise ValueError(f"doc {d.id!r} has no vector; {gen.name} holds {gen.dim}-dimensional ones")
                if len(row[-1]) != 4 * gen.dim:
                    raise ValueError(
                        f"doc {d.id!r} has a {len(row[-1]) // 4}-dimensional vector; {gen.name} holds {gen.dim}"
                    )
            versions = self._bump(gen, {r[5] for r in rows})
            if gen.context:  # the turn's own text, then the previous turn's apart (split_search_text)
                args = []
                for r in rows:
                    own, context = split_search_text(r[12])
                    extra = (" ".join(grams_of(own)), context, " ".join(grams_of(context)))
                    args.append((*r[:12], own, *r[13:], versions[r[5]], *extra))
            elif gen.grams:
                args = [(*r, versions[r[5]], " ".join(grams_of(r[12]))) for r in rows]
            else:
                args = [(*r, versions[r[5]]) for r in rows]
            self._conn.executemany(upsert_sql(gen.id, gen.grams, gen.context), args)

    async def delete_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        before_seq: int | None = None,
        at_seq: int | None = None,
        generation: str | None = None,
    ) -> None:
        """Delete the session's docs (only ``seq < before_seq``, or the one
        at ``at_seq``, if given)."""
        await self._run(
            self._delete,
            "session_key",
            scope_key(app, user, session),
            scope_key(app, user),
            before_seq,
            generation,
            at_seq,
        )

    async def delete_user(
        self, app: str, user: str, *, before_seq: int | None = None, generation: str | None = None
    ) -> None:
        """Delete all the user's docs in ``app`` (only ``seq < before_seq`` if given)."""
        key = scope_key(app, user)
        await self._run(self._delete, "user_key", key, key, before_seq, generation)

    def _delete(
        self, column: str, key: str, user_key: str, before_seq: int | None, name: str | None, at_seq: int | None = None
    ) -> None:
        with self._tx(write=True):
            gen = self._gen(name)
            if gen is None:
                return  # nothing was ever indexed
            sql = f"DELETE FROM docs_{gen.id} WHERE {column} = ?"
            args: list[Any] = [key]
            if before_seq is not None:
                sql += " AND seq < ?"
                args.append(before_seq)
            if at_seq is not None:
                sql += " AND seq = ?"
                args.append(at_seq)
            if self._conn.execute(sql, args).rowcount:
                self._bump(gen, {user_key}, deleted=True)

    # --- reads ------------------------------------------------------------------------

    def _read(self, fn: Callable[[], T]) -> T:
        with self._tx():
            return fn()

    async def count(self, *, app: str | None = None, user: str | None = None, generation: str | None = None) -> int:
        """Docs in a generation (default: the live one; 0 if none), optionally of one app or user."""
        return await self._run(self._count, app, user, generation)

    def _count(self, app: str | None, user: str | None, name: str | None) -> int:
        with self._tx():
            gen = self._gen(name)
            if gen is None:
                return 0
            where, args = _owner(app, user)
            return self._conn.execute(f"SELECT count(*) FROM docs_{gen.id} WHERE {where}", args).fetchone()[0]

    async def export(
        self, *, app: str | None = None, user: str | None = None, generation: str | None = None
    ) -> AsyncIterator[Doc]:
        """Every doc (with its vector) of a generation (default: the live one
        when the export starts), optionally of one app or user. Read in pages
        of ``page_size``, each its own short read transaction."""
        if generation is None:
            live = await self.live()
            if live is None:
                return
            generation = live.generation  # stay on it even if another is promoted meanwhile
        after = 0
        while True:
            after, docs = await self._run(self._export_page, app, user, generation, after)
            for d in docs:
                yield d
            if len(docs) < self.page_size:
                return

    def _export_page(self, app: str | None, user: str | None, name: str, after: int) -> tuple[int, list[Doc]]:
        with self._tx():
            gen = self._gen(name)
            where, args = _owner(app, user)
            rows = self._conn.execute(
                f"SELECT {_cols(gen)}, vector FROM docs_{gen.id} WHERE rid > ? AND {where} ORDER BY rid LIMIT ?",
                [after, *args, self.page_size],
            ).fetchall()
        docs = [_row_doc(r[:-1], np.frombuffer(r[-1], "<f4").tolist() if gen.dim else None) for r in rows]
        return (rows[-1][0] if rows else after), docs

    async def search(self, query: SearchQuery, *, generation: str | None = None) -> list[Hit]:
        """The best ``query.k`` hits in the query's scope, best first.

        ``keyword``: FTS5 BM25 over search_text (score: -bm25, higher is
        better); ``vector``: cosine to ``query.vector``; ``hybrid``: the top
        ``max(4k, 50)`` of each, fused by :func:`relative_score_fusion` with
        ``query.alpha`` (``scores`` also holds each side's own score). As in
        the Weaviate backend, a hybrid search without words runs as vector,
        without a vector as keyword. Hits carry the doc without its vector.
        """
        if query.mode not in ("keyword", "vector", "hybrid"):
            raise ValueError(f"unknown search mode {query.mode!r}")
        match = match_expression(query.text, grams=True)  # words or not; _keyword makes a generation's own
        mode = query.mode
        if mode == "hybrid" and match is None:
            mode = "vector"
        elif mode == "hybrid" and query.vector is None:
            mode = "keyword"
        if mode == "vector" and query.vector is None:
            raise ValueError("a vector search needs query.vector")
        if query.k <= 0 or (mode == "keyword" and match is None):
            return []
        return await self._run(self._search, query, mode, match, generation)

    def _search(self, q: SearchQuery, mode: str, match: str | None, name: str | None) -> list[Hit]:
        # One read transaction: both sides, the cache check and the docs see one snapshot.
        with self._tx():
            gen = self._gen(name)
            if gen is None:
                return []
            if mode == "vector":
                return [Hit(d, s, {"vector": s}) for d, s in self._vector(gen, q, q.k)]
            if match is None:  # search() runs a keyword or hybrid search without words as something else
                raise ValueError(f"a {mode} search needs words to match")
            if mode == "keyword":
                return [Hit(d, s, {"keyword": s}) for d, s in self._keyword(gen, q, match, q.k)]
            n = max(q.k * 4, 50)
            kw = {d.uuid: (d, s) for d, s in self._keyword(gen, q, match, n)}
            vec = {d.uuid: (d, s) for d, s in self._vector(gen, q, n)}
            fused = relative_score_fusion(
                [(u, s) for u, (_, s) in kw.items()], [(u, s) for u, (_, s) in vec.items()], q.alpha
            )
            hits = []
            for uuid, score in fused[: q.k]:
                doc = (kw.get(uuid) or vec[uuid])[0]
                sides = {side: found[uuid][1] for side, found in (("keyword", kw), ("vector", vec)) if uuid in found}
                hits.append(Hit(doc, score, {"hybrid": score, **sides}))
            return hits

    def _keyword(self, gen: _Gen, q: SearchQuery, match: str, limit: int) -> list[tuple[Doc, float]]:
        # The scope's token AND the words (in search_text only); bm25 weighs
        # the key columns 0, so only the words score.
        scope = (
            f'session_key : "{scope_key(q.app, q.user, q.session)}"'
            if q.session is not None
            else f'user_key : "{scope_key(q.app, q.user)}"'
        )
        fts = f"fts_{gen.id}"
        if gen.context:  # the previous turn's words count CONTEXT_WEIGHT of the turn's own
            w = CONTEXT_WEIGHT
            expr = f"{scope} AND {{search_text grams context context_grams}} : ({match})"
            score = f"-bm25({fts}, 1.0, 0.0, 0.0, 1.0, {w}, {w})"
        elif gen.grams:  # words in either column: "python" is a word in "私はPythonで"'s grams
            expr, score = f"{scope} AND {{search_text grams}} : ({match})", f"-bm25({fts}, 1.0, 0.0, 0.0, 1.0)"
        else:
            words = match_expression(q.text)
            if words is None:
                return []
            expr, score = f"{scope} AND search_text : ({words})", f"-bm25({fts}, 1.0, 0.0, 0.0)"
        where, args = _filters(q)
        if not where:
            # Score in FTS5 alone and read only the winners' rows: joining
            # reads every matching row and costs more than the scoring.
            sql = f"SELECT rowid, {score} AS score FROM {fts} WHERE {fts} MATCH ? ORDER BY score DESC, rowid LIMIT ?"
            top = self._conn.execute(sql, (expr, limit)).fetchall()
            docs = self._docs_by_rid(gen, [rid for rid, _ in top])
            return [(docs[rid], s) for rid, s in top]
        rows = self._conn.execute(
            f"SELECT {_cols(gen, 'd')}, {score} AS score FROM {fts} JOIN docs_{gen.id} AS d ON d.rid = {fts}.rowid"
            f" WHERE {fts} MATCH ? AND {where} ORDER BY score DESC, d.rid LIMIT ?",
            [expr, *args, limit],
        ).fetchall()
        return [(_row_doc(r[:-1]), r[-1]) for r in rows]

    def _vector(self, gen: _Gen, q: SearchQuery, limit: int) -> list[tuple[Doc, float]]:
        # Exact cosine over the user's rows with numpy. A user's memories are
        # thousands, not millions: a full scan costs a few ms, is always exact
        # and needs no ANN index to build, persist and keep in sync.
        qv = np.array(q.vector, dtype=np.float32)  # a copy: normalised in place below
        if qv.shape != (gen.dim,):
            raise ValueError(f"query vector has {qv.size} dimensions; generation {gen.name} has {gen.dim}")
        m = self._matrix(gen, scope_key(q.app, q.user))
        qv /= np.linalg.norm(qv) or 1.0
        mask = m.mask(q)
        if mask is None:
            rows, scores = np.arange(len(m.rids)), m.vectors @ qv
        else:  # score only the rows that pass (m.vectors[rows] copies just those)
            rows = np.flatnonzero(mask)
            scores = m.vectors[rows] @ qv
        if not len(rows):
            return []
        if len(rows) > limit:
            top = np.argpartition(-scores, limit - 1)[:limit]
            rows, scores = rows[top], scores[top]
        order = np.lexsort((m.rids[rows], -scores))  # best first; ties by rid, deterministic
        rids, scores = m.rids[rows[order]].tolist(), scores[order].tolist()
        docs = self._docs_by_rid(gen, rids)
        return [(docs[r], s) for r, s in zip(rids, scores, strict=True)]

    def _docs_by_rid(self, gen: _Gen, rids: list[int]) -> dict[int, Doc]:
        out: dict[int, Doc] = {}
        for i in range(0, len(rids), 500):  # stay under old SQLites' 999-parameter limit
            chunk = rids[i : i + 500]
            sql = f"SELECT {_cols(gen)} FROM docs_{gen.id} WHERE rid IN ({', '.join('?' * len(chunk))})"
            out.update((r[0], _row_doc(r)) for r in self._conn.execute(sql, chunk))
        return out

    def _matrix(self, gen: _Gen, user_key: str) -> _Matrix:
        """The user's vectors, from the cache while the user's version in the
        file is the cached one. After upserts (by any process) only the rows
        written since are read; after a delete, or on a miss, all of them:
        the indexing worker writes every turn, so a full reload per recall
        would cost ~5 ms per 1,000 docs."""
        row = self._conn.execute(
            "SELECT version, deleted FROM versions WHERE generation = ? AND user_key = ?", (gen.id, user_key)
        ).fetchone()
        version, deleted = row or (0, 0)
        key = (gen.id, user_key)
        m = self._cache.pop(key, None)
        if m is not None and m.version != version:
            updated = deleted <= m.version and m.apply(version, self._matrix_rows(gen, user_key, since=m.version))
            m = m if updated else None
        if m is None:
            m = _Matrix(gen.dim)
            m.apply(version, self._matrix_rows(gen, user_key))
        self._cache[key] = m  # most recently used last
        while len(self._cache) > 1 and sum(c.nbytes for c in self._cache.values()) > self.cache_bytes:
            self._cache.popitem(last=False)
        return m

    def _matrix_rows(self, gen: _Gen, user_key: str, *, since: int | None = None) -> list[tuple]:
        """The user's rows for a :class:`_Matrix`: all, or those written after version ``since``."""
        if since is None:
            return self._conn.execute(
                f"SELECT {_MATRIX_COLS} FROM docs_{gen.id} WHERE user_key = ?", (user_key,)
            ).fetchall()
        sql = f"SELECT {_MATRIX_COLS} FROM docs_{gen.id} WHERE user_key = ? AND version > ?"
        return self._conn.execute(sql, (user_key, since)).fetchall()


class _Transaction:
    """``BEGIN <mode>`` … ``COMMIT``, or ``ROLLBACK`` on an exception."""

    def __init__(self, db: sqlite3.Connection, mode: str):
        self.db, self.mode = db, mode

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute(f"BEGIN {self.mode}")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.db.execute("COMMIT")
        elif self.db.in_transaction:  # some errors (e.g. disk full) already rolled back
            self.db.execute("ROLLBACK")


def _script(db: sqlite3.Connection, script: str) -> None:
    """Run a multi-statement script inside the current transaction
    (``executescript`` would COMMIT first). Triggers hold ``;`` in their body,
    so statements are split where SQLite says one is complete."""
    stmt = ""
    for line in script.splitlines(keepends=True):
        stmt += line
        if sqlite3.complete_statement(stmt):
            db.execute(stmt)
            stmt = ""


def _doc_row(d: Doc) -> tuple:
    # No vector: an empty BLOB (upsert accepts that only in a keyword-only generation).
    vector = b"" if d.vector is None else np.asarray(d.vector, dtype="<f4").ravel().tobytes()
    return (
        d.uuid,
        d.id,
        d.app,
        d.user,
        d.session,
        d.user_key,
        d.session_key,
        d.seq,
        d.author,
        d.role,
        d.timestamp,
        d.text,
        d.search_text,
        vector,
    )


def _row_doc(r: Sequence[Any], vector: list[float] | None = None) -> Doc:
    """A Doc from a row of :func:`_cols` (rid first)."""
    _, id_, app, user, session, seq, author, role, ts, text, search_text = r
    return Doc(
        id=id_,
        app=app,
        user=user,
        session=session,
        seq=seq,
        author=author,
        role=role,
        timestamp=ts,
        text=text,
        search_text=search_text,
        vector=vector,
    )


def _owner(app: str | None, user: str | None) -> tuple[str, list[Any]]:
    """WHERE clause for an optional app and/or user (count, export)."""
    if app is not None and user is not None:
        return "user_key = ?", [scope_key(app, user)]  # the indexed column
    clauses, args = ["1"], []
    for column, value in (("app", app), ('"user"', user)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    return " AND ".join(clauses), args


def _filters(q: SearchQuery) -> tuple[str, list[Any]]:
    """WHERE clause (on alias ``d``; empty if none) for a query's author,
    role and time filters. Its scope is in the MATCH expression."""
    clauses: list[str] = []
    args: list[Any] = []
    for column, values in (("author", q.authors), ("role", q.roles)):
        if values:
            clauses.append(f"d.{column} IN ({', '.join('?' * len(values))})")
            args.extend(values)
    if q.since is not None:
        clauses.append("d.timestamp >= ?")
        args.append(q.since)
    if q.until is not None:
        clauses.append("d.timestamp < ?")
        args.append(q.until)
    return " AND ".join(clauses), args
