"""The real-model guide's agent loop (docs/guide/real-model.md) runs as
written against a real OpenAI-compatible server: llama.cpp with Gemma 3 270M
(the ``llama_server`` fixture), with memq's persistence and query workers.

The block carries a skip marker (tests/integration/test_doc_snippets.py runs
its blocks against `memq up` alone, without a model server); this file runs
it with the endpoint's URL in its environment, as the guide says to point it
at any endpoint."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from docsnippets import snippets
from helpers import make_settings, running_query, running_worker

GUIDE = "docs/guide/real-model.md"
DOC_URL = "nats://127.0.0.1:4222"
LOOP = [s for s in snippets() if s.path == GUIDE and s.lang == "python" and s.skip and "test_real_model_doc" in s.skip]


def test_the_guide_has_the_loop_for_this_file_to_run():
    assert len(LOOP) == 1, [s.id for s in LOOP]
    assert DOC_URL in LOOP[0].code and "OPENAI_BASE_URL" in LOOP[0].code


async def test_the_agent_loop_runs_against_a_real_model(llama_server, nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    program = tmp_path / "loop.py"
    program.write_text(LOOP[0].code.replace(DOC_URL, nats_url))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMQ_", "OPENAI_"))}
    env |= {"OPENAI_BASE_URL": llama_server.url, "MEMQ_EXAMPLE_MODEL": llama_server.model}
    async with running_worker(settings), running_query(settings):
        run = await asyncio.to_thread(
            subprocess.run, [sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=300
        )
    assert run.returncode == 0, f"{LOOP[0].id}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    lines = run.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines[:4]] == ["ana", "model", "ana", "model"], run.stdout
    assert lines[-1] == "4 events stored", run.stdout
