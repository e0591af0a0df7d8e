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
        session + "/events/{seq}": {"delete"},
        session + "/history": {"get"},
        session + "/context": {"get", "post"},
        session + "/state": {"get", "patch"},
        "/v1/apps/{app}/users/{user}/state": {"get", "patch"},
        "/v1/apps/{app}/users/{user}/search": {"get"},
        "/v1/apps/{app}/users/{user}/facts": {"get"},
        "/v1/apps/{app}/users/{user}/facts/{fact_id}/history": {"get"},
        "/v1/apps/{app}/users/{user}/profile": {"get"},
    }
    assert {p: set(item) for p, item in paths.items()} == expected


def test_every_typed_error_says_its_http_status() -> None:
    """Each error class carries its status: only a bug (or an error no
    class names) is a 500, and every other status is one the API documents."""
    from memq.contracts.errors import ERRORS_BY_CODE, Internal, MemqError
    from memq.workers.http.error_responses import DOCUMENTED as _ERRORS

    statuses = {code: cls.http_status for code, cls in ERRORS_BY_CODE.items()}
    assert {code for code, status in statuses.items() if status == 500} == {MemqError.code, Internal.code}
    assert set(statuses.values()) - {500} <= set(_ERRORS)
    assert statuses["conflict"] == 409 and not ERRORS_BY_CODE["conflict"].retry_later
    assert {code for code, cls in ERRORS_BY_CODE.items() if cls.retry_later} == {
        "not_committed",
        "unavailable",
        "busy",
        "publish_failed",
    }


_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength")


def _bounds(schema: dict) -> dict:
    """A JSON schema's bounds, through an ``anyOf`` with null (an optional field)."""
    found = {k: schema[k] for k in _BOUND_KEYS if k in schema}
    for branch in schema.get("anyOf", ()):
        found |= _bounds(branch)
    return found


def test_the_gateways_inputs_have_the_contracts_bounds() -> None:
    """Every query parameter and context-body field that the query service
    also checks has the same bounds as the contract's field: said once, in
    contracts/queries.py, and refused at the gateway's door as there."""
    from memq.contracts import queries as q

    def contract(*models):
        props: dict[str, dict] = {}
        for model in models:
            props |= model.model_json_schema()["properties"]
        return props

    by_route = {
        "/context": contract(q.ContextGet, q.StrategySpec),
        "/history": contract(q.HistoryGet, q.StrategySpec),
        "/search": contract(q.Search) | {"q": q.Search.model_json_schema()["properties"]["query"]},
        "/sessions": contract(q.SessionsList),
        "/events": contract(q.SessionGet),
        "/sessions/{session}": contract(q.SessionGet),
    }
    doc = json.loads(openapi.DEFAULT_PATH.read_text(encoding="utf-8"))
    compared = []
    for path, item in doc["paths"].items():
        fields = next((f for suffix, f in by_route.items() if path.endswith(suffix)), None)
        if fields is None:
            continue
        for method, op in item.items():
            params = {p["name"]: p["schema"] for p in op.get("parameters", ()) if p["in"] == "query"}
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
            if ref == "#/components/schemas/ContextBody":
                params |= doc["components"]["schemas"]["ContextBody"]["properties"]
            for name, schema in params.items():
                if name in fields and _bounds(fields[name]):
                    compared.append((path, method, name))
                    assert _bounds(schema) == _bounds(fields[name]), (path, method, name)
    # the comparison reached the inputs it is about
    assert {
        ("/v1/apps/{app}/users/{user}/sessions/{session}/context", "post", "recall_limit"),
        ("/v1/apps/{app}/users/{user}/sessions/{session}/context", "get", "budget"),
        ("/v1/apps/{app}/users/{user}/search", "get", "q"),
        ("/v1/apps/{app}/users/{user}/sessions", "get", "limit"),
    } <= set(compared)
