"""The worked example of docs/contributing.md (a new worker kind, *tally*)
is a kind that works: its code, taken from the page, registered by one
line in KINDS, opened, started and stopped by the process runtime against a
real NATS server."""

from __future__ import annotations

import asyncio
import sys
import types

import docsnippets as ds
import nats
import orjson
import pytest

from memq.contracts.subjects import PREFIX, events_subject
from memq.workers.runtime.app import Process
from memq.workers.runtime.component import Component
from memq.workers.runtime.kinds import KINDS, Kind
from memq.workers.settings import Settings

PAGE = "docs/contributing.md"
MODULE = "memq_doc_example_tally"  # the page's module, as if it were workers/tally/worker.py


def example_code() -> str:
    (snippet,) = [s for s in ds.snippets() if s.path == PAGE and s.lang == "python" and "class TallyWorker(" in s.code]
    return snippet.code


@pytest.fixture
def tally(monkeypatch):
    """The page's kind, importable by its "module:Class" and registered."""
    module = types.ModuleType(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, module)
    exec(compile(example_code(), f"{PAGE} (tally)", "exec"), module.__dict__)
    monkeypatch.setitem(KINDS, "tally", Kind("tally", f"{MODULE}:TallyWorker", lambda s: module.DURABLE))
    return module


def test_the_example_is_about_forty_lines():
    code = [ln for ln in example_code().splitlines() if ln.strip() and not ln.lstrip().startswith(("#", '"""'))]
    assert len(code) <= 60, len(code)


async def test_the_example_kind_runs_in_a_process(tally, nats_url, tmp_path):
    settings = Settings(data_dir=tmp_path, nats={"url": nats_url})
    component = KINDS["tally"].make(settings)
    assert isinstance(component, Component) and component.KIND == "tally"
    process = Process(settings, [component])
    nc = await nats.connect(nats_url)
    try:
        await process.start()  # open(), then start(): build, run, the micro service, serve
        assert component.ready.is_set()
        js = nc.jetstream()
        for app, n in (("app-1", 3), ("app-2", 1)):
            for _ in range(n):
                await js.publish(events_subject(app, "u", "s"), b"{}")

        async def counts() -> dict[str, int]:
            return orjson.loads((await nc.request(f"{PREFIX}.tally", b"", timeout=2)).data)

        for _ in range(100):
            if await counts() == {"app-1": 3, "app-2": 1}:
                break
            await asyncio.sleep(0.05)
        assert await counts() == {"app-1": 3, "app-2": 1}
        for name, check in component.checks().items():
            await check()  # ready in every respect: raises if not
            assert name in {"nats", "consumer"}
        info = await nc.request("$SRV.INFO.memq-tally", b"", timeout=2)
        assert orjson.loads(info.data)["description"] == tally.TallyWorker.DESCRIPTION
    finally:
        await process.stop()  # stop(): the service, then halt
        await nc.close()
    assert not component.live.consumer.running
