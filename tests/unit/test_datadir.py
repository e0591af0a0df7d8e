"""What `memq up`'s ready line says of the data dir (memq.workers.cli.datadir):
a new clone that reuses another's data is told so."""

from __future__ import annotations

from datetime import UTC, datetime

from memq.workers.cli.datadir import data_line, is_fresh


def test_a_dir_without_memq_data_is_fresh(tmp_path):
    assert is_fresh(tmp_path / "missing")
    (tmp_path / "memq.toml").write_text("")  # a config file put there first
    assert is_fresh(tmp_path)
    (tmp_path / "memq.db").write_text("")
    assert not is_fresh(tmp_path)


def test_the_line_says_new_or_what_is_there(tmp_path):
    since = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
    assert data_line(tmp_path, True, 0, None) == f"{tmp_path} (new)"
    assert data_line(tmp_path, False, 0, since) == f"{tmp_path} (no events yet)"
    local = since.astimezone().strftime("%Y-%m-%d %H:%M")
    assert data_line(tmp_path, False, 1234, since) == (
        f"{tmp_path} (existing: 1234 events since {local}; MEMQ_DATA_DIR picks another)"
    )
    assert data_line(tmp_path, False, None, None) == f"{tmp_path} (no events yet)"
