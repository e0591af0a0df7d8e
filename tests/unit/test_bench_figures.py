"""compare_trees.py's pure part (tests/bench/figures.py): which numbers of a
benchmark's JSON are figures, how list items are matched across trees, and
when a new tree's runs are within the old tree's spread."""

from __future__ import annotations

from bench.figures import Row, compare, figures


def run(p50: float, per_s: float, recall: float, stored: int = 4000) -> dict:
    return {
        "machine": {"nproc": 2, "cpu_busy_at_start": 0.5},
        "config": {"events": 3000, "p50_target_ms": 5},
        "rows": [
            {"database": "PostgreSQL", "replicas": 1, "p50_ms": p50, "commit_per_s": per_s, "stored_rows": stored},
            {"database": "SQLite", "replicas": 1, "p50_ms": p50 * 2, "cpu_ms_per_1k": {"client": 9.0}},
        ],
        "recall@10": recall,
        "startup_s": 3.3,
    }


def test_figures_are_the_headline_numbers_by_key_path_and_list_items_by_what_names_them():
    assert dict(figures(run(30.0, 2000.0, 0.8))) == {
        "rows[PostgreSQL,replicas=1]/p50_ms": 30.0,
        "rows[PostgreSQL,replicas=1]/commit_per_s": 2000.0,
        "rows[PostgreSQL,replicas=1]/stored_rows": 4000.0,
        "rows[SQLite,replicas=1]/p50_ms": 60.0,
        "recall@10": 0.8,
    }


def test_items_that_nothing_names_apart_are_matched_by_position():
    data = {"runs": [{"kind": "a", "p50_ms": 1.0}, {"kind": "a", "p50_ms": 2.0}, {"p99_ms": 3.0}]}
    assert dict(figures(data)) == {"runs[0]/p50_ms": 1.0, "runs[1]/p50_ms": 2.0, "runs[2]/p99_ms": 3.0}


def test_a_timed_figure_is_within_when_the_two_ranges_overlap():
    assert Row("x/p50_ms", [10, 12, 14], [13.9, 20, 21]).within
    assert Row("x/p50_ms", [10, 12, 14], [5, 6, 10]).within
    assert not Row("x/p50_ms", [10, 12, 14], [14.1, 15, 16]).within
    assert not Row("x/commit_per_s", [100, 110], [90, 99]).within


def test_a_count_or_quality_figure_the_same_in_every_old_run_must_come_out_exactly_the_same():
    same = Row("recall@10", [0.8, 0.8, 0.8], [0.8, 0.8, 0.8])
    assert same.exact and same.within
    assert not Row("recall@10", [0.8, 0.8, 0.8], [0.8, 0.8, 0.79]).within
    assert not Row("rows[PostgreSQL]/stored_rows", [4000, 4000], [3999, 4000]).within
    # one that varies from run to run (an index built concurrently) is judged by its spread
    noisy = Row("recall@10", [0.79, 0.8, 0.81], [0.795, 0.82])
    assert not noisy.exact and noisy.within
    # a timed figure is never exact, even when it rounds to one value
    assert not Row("x/p50_ms", [2.0, 2.0], [2.1, 2.2]).exact


def test_compare_keeps_the_figures_every_run_of_both_trees_reports_and_lists_the_rest():
    old = [run(30, 2000, 0.8), run(34, 1900, 0.8)]
    new = [run(31, 2100, 0.8), {**run(33, 1950, 0.7), "new_figure_per_s": 5.0}, run(32, 2050, 0.8)]
    del old[1]["recall@10"]
    rows, old_only, new_only = compare(old, new)

    by = {r.figure: r for r in rows}
    assert set(by) == {
        "rows[PostgreSQL,replicas=1]/p50_ms",
        "rows[PostgreSQL,replicas=1]/commit_per_s",
        "rows[PostgreSQL,replicas=1]/stored_rows",
        "rows[SQLite,replicas=1]/p50_ms",
    }
    assert by["rows[PostgreSQL,replicas=1]/p50_ms"].new == [31, 33, 32]
    assert all(r.within for r in rows)
    # recall@10 is missing from one old run; new_figure_per_s from two new ones
    assert (old_only, new_only) == ([], ["recall@10"])
    summary = by["rows[SQLite,replicas=1]/p50_ms"].summary()
    assert summary["old"] == {"median": 64, "min": 60, "max": 68, "runs": [60, 68]}
    assert summary["kind"] == "spread" and summary["within"]


def test_every_number_of_a_table_its_key_names_is_a_timed_figure():
    data = {"ms_per_text": {"int8, one at a time": 9.5}, "steps_p50_ms": {"append user": 1.4}, "notes": {"x": 1}}
    assert dict(figures(data)) == {"ms_per_text/int8, one at a time": 9.5, "steps_p50_ms/append user": 1.4}
    assert not Row("ms_per_text/int8, one at a time", [9.5, 9.5], [9.6]).exact


def test_a_table_of_tables_is_figures_all_the_way_down():
    data = {"results": [{"backend": "embedded", "recall": {"hybrid": {"overall": {"10": 0.81}}}, "index_s": 24.0}]}
    assert dict(figures(data)) == {"results[embedded]/recall/hybrid/overall/10": 0.81}
    assert Row("results[embedded]/recall/hybrid/overall/10", [0.81, 0.81], [0.8]).exact


def test_a_row_named_by_its_config_is_keyed_by_it():
    data = {"results": [{"config": "token_window", "evidence": 0.5}, {"config": "buffer_window", "evidence": 0.4}]}
    assert dict(figures(data)) == {"results[token_window]/evidence": 0.5, "results[buffer_window]/evidence": 0.4}


def test_the_query_benchs_counted_requests_are_not_figures():
    # A hit row's cache hits follow its throughput: compared as a fixed count
    # they would differ between any two runs.
    row = {"replicas": 1, "op": "context", "cache": "hit", "c1": {"p50_ms": 0.5, "requests": 900}}
    found = dict(figures({"rows": [{**row, "counted": {"hits": 900.0, "misses": 0.0, "recall_skipped": 0.0}}]}))

    assert found == dict(figures({"rows": [row]})) and found
    assert not any("counted" in key for key in found)
