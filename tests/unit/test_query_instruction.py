"""The query worker's bound on a context's rendered instruction (issue 38):
refused from its predicted size, before it is built, at the lower of
``query.max_instruction_chars`` and what one reply can carry."""

from __future__ import annotations

import pytest

from memq.contracts import queries as q
from memq.contracts.errors import Oversize
from memq.workers.query.ops import OpContext, _instruction
from memq.workers.settings import MemorySettings, QuerySettings


def request(fmt: q.ContextFormat = "memq") -> q.ContextGet:
    return q.ContextGet(app="a", user="u", session="s", format=fmt, instruction="{k}")


def ctx(max_chars: int = 1_000_000, reply_bytes: int = 10_000) -> OpContext:
    return OpContext(memory=MemorySettings(), apps={}, reply_bytes=reply_bytes, max_instruction_chars=max_chars)


def test_the_setting_is_the_worker_default():
    assert QuerySettings().max_instruction_chars == OpContext(memory=MemorySettings(), apps={}).max_instruction_chars


def test_up_to_the_dedicated_limit_it_renders():
    assert _instruction(request(), "<{k}>", {"k": "x" * 98}, ctx(max_chars=100)) == "<" + "x" * 98 + ">"
    with pytest.raises(Oversize) as err:
        _instruction(request(), "<{k}>", {"k": "x" * 99}, ctx(max_chars=100))
    assert err.value.message.startswith(
        "context: the instruction would render to 101 characters, over the limit of 100 (query.max_instruction_chars)"
    )


def test_memqs_format_carries_it_twice_so_half_a_reply_is_the_limit():
    state = {"k": "x" * 6_000}
    assert _instruction(request("openai"), "{k}", state, ctx()) == state["k"]  # one copy in 10,000 bytes
    with pytest.raises(Oversize) as err:
        _instruction(request("memq"), "{k}", state, ctx())
    assert "over the limit of 5,000 (what one reply of 10,000 bytes carries in memq format, which holds it twice)" in (
        err.value.message
    )


def test_a_huge_rendering_is_refused_without_building_it(monkeypatch):
    import memq.workers.query.ops as ops

    def never(*args, **kwargs):
        raise AssertionError("rendered")

    monkeypatch.setattr(ops, "render", never)
    with pytest.raises(Oversize, match="would render to 1,200,000,000 characters"):
        _instruction(request(), "{k}" * 60_000, {"k": "y" * 20_000}, ctx())
