"""The gateway's JSON budget (workers/http/budget.py): elements and depth
counted on raw bytes, chunk by chunk, as a JSON lexer would count them
(checked against a character-by-character lexer on any JSON cut anywhere)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.workers.http.budget import JsonBudget, OverBudget

MIB = 1024 * 1024


def reference(body: bytes) -> tuple[int, int]:
    """(elements, deepest) by walking the bytes one at a time."""
    elements = depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        char = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            elements += 1
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
        elif char == ",":
            elements += 1
    return elements, deepest


def counted(body: bytes, cuts: list[int]) -> JsonBudget:
    budget = JsonBudget(max_elements=10**9, max_depth=10**9)
    start = 0
    for cut in sorted({min(c, len(body)) for c in cuts}) + [len(body)]:
        budget.feed(body[start:cut])
        start = cut
    return budget


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('ab\\"\n,[]{}é'), max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='k\\"{,', max_size=3), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values, st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_the_count_is_a_lexers_wherever_the_body_is_cut(value, cuts, ascii_only):
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    budget = counted(body, cuts)
    assert (budget.elements, budget.deepest) == reference(body)
    assert budget.depth == 0


def test_escapes_split_across_chunks():
    body = b'["a\\\\", "b\\"c", "\\\\\\"", {}]'
    for cut in range(len(body) + 1):
        budget = counted(body, [cut])
        assert (budget.elements, budget.deepest) == reference(body) == (5, 2), cut


def test_many_elements_are_refused_naming_the_limit():
    budget = JsonBudget(max_elements=1000, max_depth=64)
    with pytest.raises(OverBudget, match=r"more than 1000 elements \(http.max_json_elements\)"):
        budget.feed(b'{"events":[' + b",".join([b"{}"] * 600) + b"]}")


def test_deep_nesting_is_refused_naming_the_limit():
    budget = JsonBudget(max_elements=1000, max_depth=64)
    budget.feed(b"[" * 64)
    with pytest.raises(OverBudget, match=r"deeper than 64 levels \(http.max_json_depth\)"):
        budget.feed(b"[")


def test_brackets_and_commas_inside_strings_do_not_count():
    budget = JsonBudget(max_elements=10, max_depth=2)
    budget.feed(json.dumps({"text": "[{,}]" * 10_000}).encode())
    assert (budget.elements, budget.deepest) == (1, 1)


def test_a_chunk_costs_little_whatever_it_holds():
    # The loop runs each chunk's count: bounded C passes over its bytes, no Python per byte.
    chunk = b'"a\\"",' * (256 * 1024 // 6)  # quotes and escapes everywhere: the costliest shape
    budget = JsonBudget(max_elements=10**9, max_depth=64)
    started = time.perf_counter()
    for _ in range(16):  # 4 MiB
        budget.feed(chunk)
    elapsed = time.perf_counter() - started
    assert budget.elements == 16 * (256 * 1024 // 6)
    assert elapsed < 2.0, f"4 MiB counted in {elapsed:.2f}s"  # ~0.1 s here; a per-byte loop takes ~1 s
