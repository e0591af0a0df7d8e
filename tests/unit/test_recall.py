"""What long-term memory indexes (storage scopes) and how hybrid scores fuse."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memq.contracts.schemas import (
    CheckpointSaved,
    Event,
    EventAppended,
    Message,
    SessionDeleted,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from memq.workers.memory.recall import Doc, Hit, doc_for, doc_uuid, hit_dict, relative_score_fusion


def appended(role: str, *parts, author: str | None = None, ts: float = 1_683_504_000.0) -> EventAppended:
    event = Event(
        id=f"e-{role}-{len(parts)}", author=author or role, message=Message(role=role, parts=list(parts)), timestamp=ts
    )
    return EventAppended(app="a", user="u", session="s", event=event)


USER = appended("user", TextPart(text="I adopted a puppy named Max"), author="Caroline")
ASSISTANT = appended("assistant", TextPart(text="Congratulations!"))
TOOL_CALL = appended("assistant", ToolCallPart(id="c1", name="weather", args={"city": "Lisbon"}))
TOOL_RESULT = appended("tool", ToolResultPart(id="c1", name="weather", result="sunny"))
CHECKPOINT = CheckpointSaved(app="a", user="u", session="s", summary="Caroline adopted Max.", up_to_seq=4)


def test_all_indexes_every_event_with_text_and_summaries():
    assert doc_for(1, USER, "all").text == "I adopted a puppy named Max"
    assert doc_for(3, TOOL_CALL, "all").text == 'weather({"city":"Lisbon"})'
    assert doc_for(4, TOOL_RESULT, "all").text == "sunny"
    summary = doc_for(5, CHECKPOINT, "all")
    assert (summary.role, summary.author, summary.text) == ("summary", "summarizer", "Caroline adopted Max.")


def test_conversational_keeps_user_and_assistant_text_only():
    assert doc_for(1, USER, "conversational") is not None
    assert doc_for(2, ASSISTANT, "conversational") is not None
    assert doc_for(3, TOOL_CALL, "conversational") is None  # no text part
    assert doc_for(4, TOOL_RESULT, "conversational") is None
    assert doc_for(5, CHECKPOINT, "conversational") is not None  # summaries are conversation too


def test_summaries_only_keeps_checkpoints_only():
    assert [
        doc_for(i, m, "summaries_only") is not None for i, m in enumerate([USER, ASSISTANT, TOOL_RESULT, CHECKPOINT])
    ] == [
        False,
        False,
        False,
        True,
    ]


def test_nothing_without_text_is_indexed():
    assert doc_for(1, appended("user"), "all") is None
    assert doc_for(1, appended("user", TextPart(text="   ")), "all") is None
    assert doc_for(1, SessionDeleted(app="a", user="u", session="s"), "all") is None
    assert doc_for(1, CheckpointSaved(app="a", user="u", session="s", summary=" ", up_to_seq=1), "all") is None


def test_search_text_carries_date_and_author():
    doc = doc_for(1, USER, "all")
    assert doc.search_text == "[2023-05-08] Caroline: I adopted a puppy named Max"
    assert (doc.app, doc.user, doc.session, doc.seq, doc.role) == ("a", "u", "s", 1, "user")


def test_doc_uuids_are_stable_and_scoped():
    assert doc_uuid("a", "u", "s", "e1") == doc_uuid("a", "u", "s", "e1")
    assert doc_uuid("a", "u", "s", "e1") != doc_uuid("a", "v", "s", "e1")
    assert doc_uuid("a", "u", "s", "e1") != doc_uuid("a", "u", "s2", "e1")
    # ids are length-prefixed inside scope_key: no concatenation ambiguity
    assert doc_uuid("a", "u.s", "x", "e") != doc_uuid("a", "u", "s.x", "e")


def test_fusion_is_weaviates_relative_score():
    keyword = [("a", 10.0), ("b", 5.0), ("c", 0.0)]
    vector = [("b", 0.9), ("d", 0.5)]
    fused = dict(relative_score_fusion(keyword, vector, alpha=0.5))
    assert fused == {"a": 0.5, "b": 0.5 * 1.0 + 0.5 * 0.5, "c": 0.0, "d": 0.0}
    assert relative_score_fusion(keyword, vector, alpha=0.5)[0][0] == "b"


@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-100, 100)), max_size=8, unique_by=lambda t: t[0]),
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-1, 1)), max_size=8, unique_by=lambda t: t[0]),
    st.floats(0, 1),
)
def test_fusion_properties(keyword, vector, alpha):
    fused = relative_score_fusion(keyword, vector, alpha)
    assert {k for k, _ in fused} == {k for k, _ in keyword} | {k for k, _ in vector}
    assert all(-1e-9 <= s <= 1 + 1e-9 for _, s in fused)
    assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)
    assert fused == relative_score_fusion(keyword, vector, alpha)  # deterministic


def _hit(seq: int) -> Hit:
    return Hit(Doc(f"e{seq}", "a", "u", "s", seq, "user", "user", 0.0, "t", "t"), 1.0 / seq)


def test_hit_dict_has_hectors_search_result_fields():
    d = hit_dict(_hit(3))
    assert set(d) == {"session_id", "event_id", "content", "author", "timestamp", "score", "metadata"}
    assert d["metadata"]["seq"] == 3


def test_a_turn_is_indexed_with_the_previous_one():
    from memq.workers.memory.recall import Turn

    doc = doc_for(2, ASSISTANT, "all", previous=Turn("Caroline", "I adopted a puppy named Max"))
    assert doc.text == "Congratulations!"  # what a search returns stays the turn itself
    assert doc.search_text.endswith("assistant: Congratulations!\n(after Caroline: I adopted a puppy named Max)")
    assert doc_for(5, CHECKPOINT, "all", previous=Turn("x", "y")).search_text.endswith("Caroline adopted Max.")
