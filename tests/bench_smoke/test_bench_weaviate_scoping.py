"""tests/bench/weaviate_scoping.py runs its tiny --smoke size against a real
Weaviate and reports both scopings of every operation, counts as configured."""

from __future__ import annotations

import pytest
from bench_runs import run_bench

pytestmark = pytest.mark.timeout(240)

SCOPES = {"filter", "tenant"}


def test_the_weaviate_scoping_benchmark_measures_both_scopings(tmp_path):
    result = run_bench("weaviate_scoping", "--smoke", out=tmp_path / "weaviate.json")

    cfg, res = result["config"], result["results"]
    assert result["mode"] == "smoke" and (cfg["users"], cfg["docs"]) == (4, 10)
    for scope in SCOPES:
        imported = res["import"][scope]
        assert imported["docs_per_s"] * imported["seconds"] == pytest.approx(cfg["users"] * cfg["docs"], rel=1e-6)
        assert res["disk"][scope] > 0
    assert set(res["search"]) == {"keyword", "vector", "hybrid"}
    for kind, by_scope in [*res["search"].items(), *res["delete"].items()]:
        assert set(by_scope) == SCOPES, kind
        for scope, r in by_scope.items():
            assert r["n"] == (cfg["queries"] if kind in res["search"] else cfg["deletes"]), (kind, scope)
            assert 0 < r["p50_ms"] <= r.get("p99_ms", r["p50_ms"]), (kind, scope)
    ratios = result["ratios_tenant_over_filter"]
    assert ratios["search vector p50"] == pytest.approx(
        res["search"]["vector"]["tenant"]["p50_ms"] / res["search"]["vector"]["filter"]["p50_ms"]
    )
