"""One op registry (memq.contracts.queries.OPS) and one reply envelope
(memq.contracts.replies), read by the client and the query worker alike."""

from __future__ import annotations

import typing

import orjson
import pytest

from memq.contracts import queries as q
from memq.contracts.errors import ERRORS_BY_CODE, MemqError, NotFound, Unavailable
from memq.contracts.replies import MAX_ERROR_MESSAGE, error_body, ok_body, parse_reply
from memq.workers.query.ops import HANDLERS
from memq.workers.settings import MemorySettings, RecallSettings


def test_every_op_of_the_contract_has_a_handler_and_no_handler_lacks_an_op():
    assert list(HANDLERS) == list(q.OPS)


def test_the_registry_names_each_op_once_with_its_own_models():
    for name, op in q.OPS.items():
        assert op.name == name and op.summary
        assert issubclass(op.request, q.Request) and issubclass(op.reply, q.Reply)
    assert len({op.request for op in q.OPS.values()}) == len(q.OPS)


def test_only_search_waits_for_the_index():
    assert [name for name, op in q.OPS.items() if op.waits_for == "indexing"] == ["search"]


@pytest.mark.parametrize("code", sorted(ERRORS_BY_CODE))
def test_an_error_body_reads_back_as_the_same_typed_error(code):
    sent = ERRORS_BY_CODE[code]("the reason")
    with pytest.raises(MemqError) as got:
        parse_reply("history", error_body(sent))
    assert type(got.value) is type(sent) and got.value.message == "the reason"


def test_the_envelope_is_the_wire_format_agents_rely_on():
    assert orjson.loads(error_body(NotFound("no session"))) == {
        "ok": False,
        "error": {"code": "not_found", "message": "no session"},
    }
    view = q.StateView(state={"app:x": 1})
    assert orjson.loads(ok_body(view)) == {"ok": True, "result": {"state": {"app:x": 1}}}
    assert parse_reply("state.get", ok_body(view)) == view


def test_a_long_error_message_is_cut_so_that_the_reply_fits():
    body = orjson.loads(error_body(Unavailable("x" * 100_000)))
    assert len(body["error"]["message"]) == MAX_ERROR_MESSAGE


@pytest.mark.parametrize(
    "data",
    [b'{"ok": false}', b'{"ok": false, "error": {"message": "no code"}}', b'{"ok": "yes", "result": {}}'],
)
def test_an_envelope_without_what_its_ok_promises_is_malformed(data):
    with pytest.raises(MemqError, match="malformed state.get reply"):
        parse_reply("state.get", data)


def test_settings_and_requests_name_strategies_and_modes_from_one_vocabulary():
    assert typing.get_args(MemorySettings.model_fields["strategy"].annotation) == q.STRATEGY_KINDS
    assert typing.get_args(RecallSettings.model_fields["mode"].annotation) == q.SEARCH_MODES
    assert set(typing.get_args(q.StrategyName)) == set(q.STRATEGY_NAMES)
    assert typing.get_args(q.ContextGet.model_fields["format"].annotation) == q.CONTEXT_FORMATS
    assert typing.get_args(q.Search.model_fields["mode"].annotation) == q.SEARCH_MODES
