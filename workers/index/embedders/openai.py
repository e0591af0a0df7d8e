"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint.

Works with OpenAI, Ollama, vLLM, Hugging Face TEI and the llama.cpp server:
``POST {base_url}/embeddings`` with ``{"model", "input": [...]}`` (and
``"dimensions"`` when set), reply ``{"data": [{"index", "embedding"}, ...]}``.
Replies are re-ordered by ``index`` and L2-normalised here, since not every
server normalises. The API key is sent only as a Bearer header and never
appears in logs or errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx
import numpy as np

from memq.workers import http_retry, metrics
from memq.workers.index.embedders.base import EmbedderError
from memq.workers.settings import OpenAIEmbedderSettings, mask_url

log = logging.getLogger(__name__)

# Backoff between attempts: RETRY_BASE_S * 2**attempt (with jitter), and a
# server's Retry-After, both capped at RETRY_MAX_S. Tests make them tiny.
RETRY_BASE_S = 0.5
RETRY_MAX_S = 20.0
PROBE_TEXT = "dimension probe"


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint.

    Parameters (``OpenAIEmbedderSettings``):
        base_url: the ``/v1`` root (default ``https://api.openai.com/v1``).
        api_key: sent as ``Authorization: Bearer``; unset (default) sends none.
        model: the served model (default ``text-embedding-3-small``).
        dimensions: ask for shorter vectors (default None: the model's size).
        batch_size: texts per request (default 64).
        timeout_s: per request (default 30).
        retries: extra attempts on timeouts, connection errors, 429 and 5xx
            (default 3); any other 4xx fails at once.

    ``dim`` is ``dimensions`` when set, else 0 until :meth:`open` (or the first
    call) learns it from a reply; :func:`~memq.workers.index.embedders.open_embedder`
    calls :meth:`open`.
    """

    def __init__(self, settings: OpenAIEmbedderSettings | None = None):
        self.settings = s = settings or OpenAIEmbedderSettings()
        self.model = f"openai:{s.model}" + (f"@{s.dimensions}" if s.dimensions else "")
        self.dim = s.dimensions or 0
        self._url = s.base_url.rstrip("/") + "/embeddings"
        self._where = mask_url(self._url)  # for messages: no password of the URL
        headers = {"Authorization": f"Bearer {s.api_key.get_secret_value()}"} if s.api_key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(s.timeout_s))

    async def open(self) -> OpenAIEmbedder:
        """Learn ``dim`` by embedding one probe text, unless ``dimensions`` is set."""
        if not self.dim:
            await self.embed([PROBE_TEXT])
        return self

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order. Raises :class:`EmbedderError`."""
        out: list[list[float]] = []
        size = self.settings.batch_size
        started = time.perf_counter()
        for start in range(0, len(texts), size):
            out.extend(await self._embed_batch(list(texts[start : start + size])))
        if texts:
            metrics.embedded(self.model, len(texts), time.perf_counter() - started)
        return out

    async def close(self) -> None:
        await self._client.aclose()

    # --- one request ------------------------------------------------------

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        body: dict = {"model": self.settings.model, "input": batch}
        if self.settings.dimensions:
            body["dimensions"] = self.settings.dimensions
        reply = await http_retry.post_json(
            self._client,
            self._url,
            body,
            error=EmbedderError,
            where=self._where,
            what="embeddings",
            attempts=self.settings.retries + 1,
            base_s=RETRY_BASE_S,
            max_s=RETRY_MAX_S,
            secret=self._secret,
            logger=log,
        )
        return self._parse(reply, len(batch))

    def _parse(self, reply: httpx.Response, count: int) -> list[list[float]]:
        try:
            data = reply.json()["data"]
            items = sorted(data, key=lambda d: d["index"])
            indexes = [d["index"] for d in items]
            vectors = [d["embedding"] for d in items]
        except (ValueError, KeyError, TypeError) as e:
            excerpt = http_retry.excerpt(reply.text, self._secret)
            raise EmbedderError(f"{self._where}: not an embeddings reply ({e!r}): {excerpt}") from None
        if indexes != list(range(count)):
            raise EmbedderError(f"{self._where}: asked for {count} embeddings, got indexes {indexes[:10]}")
        widths = sorted({len(v) if isinstance(v, list) else -1 for v in vectors})
        if len(widths) != 1 or widths[0] <= 0:
            raise EmbedderError(f"{self._where}: vectors of different or invalid lengths {widths[:5]}")
        width = widths[0]
        if self.dim and width != self.dim:
            raise EmbedderError(f"{self._where}: got {width}-dimensional vectors, expected {self.dim}")
        try:
            array = np.asarray(vectors, dtype=np.float32)
        except (ValueError, TypeError):
            array = None  # ragged: nested lists of different lengths
        if array is None or array.ndim != 2:
            # llama.cpp without pooling answers one vector per token
            raise EmbedderError(
                f"{self._where}: embeddings are not one list of numbers per text "
                "(per-token vectors from a server without pooling?)"
            )
        self.dim = width
        array /= np.clip(np.linalg.norm(array, axis=1, keepdims=True), 1e-12, None)
        return array.tolist()

    @property
    def _secret(self) -> str | None:
        return self.settings.api_key.get_secret_value() if self.settings.api_key else None
