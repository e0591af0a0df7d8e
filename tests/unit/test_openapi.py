"""The committed OpenAPI document (contracts/openapi.json) is the one the
gateway serves, and it describes every route with its auth and errors."""

from __future__ import annotations

import json

from memq.workers.http import openapi


def test_the_committed_document_is_current() -> None:
    assert openapi.DEFAULT_PATH.is_file(), f"no {openapi.DEFAULT_PATH}: run `{openapi.COMMAND}`"
    stale = openapi.DEFAULT_PATH.read_text(encoding="utf-8") != openapi.render(openapi.document())
    assert not stale, f"{openapi.DEFAULT_PATH} is stale: run `{openapi.COMMAND}` and commit it"


def test_every_operation_needs_a_key_and_documents_its_errors() -> None:
    doc = json.loads(openapi.DEFAULT_PATH.read_text(encoding="utf-8"))
    operations = [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]
    assert {m for _, m, _ in operations} == {"get", "post", "delete", "patch"}
    for path, method, op in operations:
        assert path.startswith("/v1/apps/{app}/"), path
        assert op["security"] == [{"HTTPBearer": []}, {"APIKeyHeader": []}], (path, method)
        for status in ("401", "403", "422", "503"):
            body = op["responses"][status]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, (path, method, status)


def test_the_session_endpoints_are_all_there() -> None:
    paths = json.loads(openapi.DEFAULT_PATH.read_text(encoding="utf-8"))["paths"]
    session = "/v1/apps/{app}/users/{user}/sessions/{session}"
    expected = {
        "/v1/apps/{app}/sessions": {"get"},
        "/v1/apps/{app}/users/{user}/sessions": {"get", "post"},
        session: {"get", "delete"},
        session + "/events": {"get", "post"},
        session + "/history": {"get"},
        session + "/context": {"get", "post"},
        session + "/state": {"get", "patch"},
        "/v1/apps/{app}/users/{user}/state": {"get", "patch"},
        "/v1/apps/{app}/users/{user}/search": {"get"},
    }
    assert {p: set(item) for p, item in paths.items()} == expected


def test_every_typed_error_says_its_http_status() -> None:
    """Each error class carries its status: only a bug (or an error no
    class names) is a 500, and every other status is one the API documents."""
    from memq.contracts.errors import ERRORS_BY_CODE, Internal, MemqError
    from memq.workers.http.api import _ERRORS

    statuses = {code: cls.http_status for code, cls in ERRORS_BY_CODE.items()}
    assert {code for code, status in statuses.items() if status == 500} == {MemqError.code, Internal.code}
    assert set(statuses.values()) - {500} <= set(_ERRORS)
    assert statuses["conflict"] == 409 and not ERRORS_BY_CODE["conflict"].retry_later
    assert {code for code, cls in ERRORS_BY_CODE.items() if cls.retry_later} == {
        "not_committed",
        "unavailable",
        "publish_failed",
    }
