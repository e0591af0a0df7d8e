"""The OpenAI-compatible embedder against a real server: llama.cpp's
(llama-cpp-python) ``/v1/embeddings`` with Gemma 3 270M. That server has no
pooling option, so it answers one vector per *token*: the embedder must
refuse such a reply clearly, never index it. The vectors-per-text path is
covered in tests/unit/test_embedders.py by a server that serves the local
model in OpenAI's format (no package here ships a pooling embeddings
server)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from memq.workers.index.embedders.base import EmbedderError
from memq.workers.index.embedders.openai import OpenAIEmbedder
from memq.workers.settings import OpenAIEmbedderSettings

KEY = "sk-do-not-print-me"


async def test_per_token_vectors_from_a_real_server_are_refused(llama_embedding_server):
    server = llama_embedding_server
    embedder = OpenAIEmbedder(
        OpenAIEmbedderSettings(base_url=server.url, model=server.model, api_key=SecretStr(KEY), retries=0)
    )
    try:
        with pytest.raises(EmbedderError) as error:
            await embedder.open()  # learns the dimension from a probe text
        assert server.url in str(error.value) and "embeddings" in str(error.value)
        assert KEY not in str(error.value)
    finally:
        await embedder.close()
