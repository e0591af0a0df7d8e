"""Instruction templates, after Hector's pkg/instruction/template.go."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.contracts.errors import MemqError
from memq.workers.memory.state import merge_state
from memq.workers.memory.template import TemplateKeyError, placeholders, render, rendered_size


def test_hector_doc_example():
    # pkg/instruction/doc.go: "Hello {user_name}, you are working on {app:project_name}."
    state = {"user_name": "Alice", "app:project_name": "MyProject"}
    out = render("Hello {user_name}, you are working on {app:project_name}.", state)
    assert out == "Hello Alice, you are working on MyProject."


def test_scopes_from_merged_state():
    state = merge_state(app={"tone": "formal"}, user={"language": "Portuguese"}, session={"topic": "taxes"})
    state["temp:step"] = 2
    tpl = "Reply in {user:language}, {app:tone} tone, about {topic}; step {temp:step}."
    assert render(tpl, state) == "Reply in Portuguese, formal tone, about taxes; step 2."


def test_optional_keys_render_empty():
    assert render("Topic: {topic?}.", {}) == "Topic: ."
    assert render("Topic: {topic?}.", {"topic": "cats"}) == "Topic: cats."
    assert render("[{ user:nick ? }]", {}) == "[]"  # spaces inside braces are ignored


def test_a_missing_key_is_a_typed_error():
    with pytest.raises(TemplateKeyError) as err:
        render("Reply in {user:language}.", {"language": "fr"})  # session key, not user:
    assert err.value.key == "user:language"
    assert err.value.code == "template_key_missing"
    assert isinstance(err.value, MemqError)
    assert err.value.to_dict()["code"] == "template_key_missing"
    assert "{user:language?}" in err.value.message


def test_values_render_as_compact_json():
    state = {"n": 3, "f": 1.5, "ok": True, "none": None, "obj": {"b": [1, 2], "a": "x"}, "s": "plain"}
    out = render("{n} {f} {ok} [{none}] {obj} {s}", state)
    assert out == '3 1.5 true [] {"a":"x","b":[1,2]} plain'


def test_literal_braces():
    assert render("Use {{user:name}} to insert a name.", {}) == "Use {user:name} to insert a name."
    assert render("{{{x}}}", {"x": 1}) == "{1}"
    assert render("a }} b {{ c", {}) == "a } b { c"


def test_text_that_is_not_a_placeholder_stays():
    # Hector: invalid placeholder names are left as-is
    tpl = 'Return {"status": "ok"} or {not valid} or {1abc} or {other:x} or {} or {a b} or { - }'
    assert render(tpl, {}) == tpl


def test_unicode_names():
    assert render("{名前} {café_2}", {"名前": "Kenji", "café_2": "ok"}) == "Kenji ok"


def test_artifacts():
    assert render("Context: {artifact.notes.md}", {}, artifacts={"notes.md": "be nice"}) == "Context: be nice"
    assert render("Context: {artifact.missing.txt?}", {}) == "Context: "
    with pytest.raises(TemplateKeyError) as err:
        render("{artifact.report.pdf}", {}, artifacts={})
    assert err.value.key == "artifact.report.pdf"


def test_placeholders():
    tpl = "{a} {user:b?} {a} {{c}} {artifact.f.txt} {not valid}"
    assert placeholders(tpl) == ["a", "user:b", "artifact.f.txt"]


@given(st.text())
def test_escaped_text_renders_back_unchanged(text):
    escaped = text.replace("{", "{{").replace("}", "}}")
    assert render(escaped, {}) == text


@given(st.text(alphabet=st.characters(blacklist_characters="{}")))
def test_text_without_braces_is_unchanged(text):
    assert render(text, {"x": 1}) == text


# --- the rendered size, known before rendering (issue 38) --------------------------

_PIECES = st.sampled_from(
    [
        "{k}", "{k?}", "{ k }", "{user:k}", "{app:n?}", "{temp:t}", "{gone?}", "{gone}", "{名前}",
        "{artifact.f.txt}", "{artifact.nope?}", "{{", "}}", "{", "}", "{}", "{not valid}", '{"a": 1}',
        "{1abc}", "{{k}}", "{{{k}}}", "é", "\n", "text ",
    ]
)  # fmt: skip
_VALUES = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.integers(-(2**63), 2**63 - 1),  # orjson's range, as state (JSON) holds
    st.booleans(),
    st.lists(st.integers(0, 10**6), max_size=3),
    st.dictionaries(st.text(max_size=3), st.text(max_size=5), max_size=3),
)
_KEYS = st.sampled_from(["k", "user:k", "app:n", "temp:t", "名前"])


@given(
    st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40).map("".join),
    st.dictionaries(_KEYS, _VALUES),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(["f.txt", "nope"]), st.text(max_size=10))),
)
def test_the_rendered_size_is_the_length_of_the_rendering(template, state, artifacts):
    try:
        rendered = render(template, state, artifacts=artifacts)
    except TemplateKeyError as err:
        with pytest.raises(TemplateKeyError) as predicted:
            rendered_size(template, state, artifacts=artifacts)
        assert predicted.value.key == err.key  # the same first missing key
        return
    assert rendered_size(template, state, artifacts=artifacts) == len(rendered)


def _one_match_at_a_time(template, state, artifacts):
    """The renderer before issue 38 (a Python callback per match): the oracle
    that the table-driven one renders the same."""
    from memq.workers.memory.template import _rendered_token

    return re.sub(r"\{\{|\}\}|\{[^{}]*\}", lambda m: _rendered_token(m.group(0), state, artifacts), template)


@given(
    st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40).map("".join),
    st.dictionaries(_KEYS, _VALUES),
)
def test_the_renderer_renders_as_one_match_at_a_time(template, state):
    try:
        expected = _one_match_at_a_time(template, state, None)
    except TemplateKeyError as err:
        with pytest.raises(TemplateKeyError) as got:
            render(template, state)
        assert got.value.key == err.key
        return
    assert render(template, state) == expected


def test_the_size_of_a_huge_rendering_is_known_without_building_it():
    # 60,000 uses of a 20 KB value: 1.2 GB if rendered, counted from one lookup
    assert rendered_size("{k}" * 60_000 + "!", {"k": "x" * 20_000}) == 60_000 * 20_000 + 1
    assert rendered_size("{n} {{k}}" * 3, {"n": {"a": [1, 2]}}) == len('{"a":[1,2]} {k}') * 3


def test_the_first_missing_key_is_named_by_both():
    for fn in (render, rendered_size):
        with pytest.raises(TemplateKeyError) as err:
            fn("{a?} {b} {c} {b}", {})
        assert err.value.key == "b"
