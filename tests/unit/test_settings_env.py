"""Settings from the environment: a misspelled ``MEMQ_*`` variable is named
(pydantic-settings ignores it in silence), and ports are checked for range
whichever way they are set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from memq.workers import security
from memq.workers.settings import OTHER_ENV, OTHER_ENV_PREFIXES, Settings, env_names, unknown_env

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("variable", "closest"),
    [
        ("MEMQ_NATS_URL", "MEMQ_NATS__URL"),  # one underscore
        ("MEMQ_DATABASE_URL", "MEMQ_DATABASE__URL"),
        ("MEMQ_PERSISTENCE__BATCHSIZE", "MEMQ_PERSISTENCE__BATCH_SIZE"),
        ("MEMQ_LOGLEVEL", "MEMQ_LOG_LEVEL"),
        ("memq_nats_url", "MEMQ_NATS__URL"),  # names are not case-sensitive
        # issue 40: these got MEMQ_QUERY__READ_TAIL and a group name (MEMQ_MEMORY)
        ("MEMQ_QUERY__CACHE_TTLL", "MEMQ_CACHE__TTL_S"),  # the group mistaken: the setting anywhere
        ("MEMQ_CACHE__TTL", "MEMQ_CACHE__TTL_S"),  # in its group first
        ("MEMQ_HTTP__PROT", "MEMQ_HTTP__PORT"),
        ("MEMQ_NATS__URLL", "MEMQ_NATS__URL"),
    ],
)
def test_a_misspelled_variable_gets_the_closest_setting(variable, closest):
    assert unknown_env({variable: "x"}) == [(variable, closest)]


@pytest.mark.parametrize("variable", ["MEMQ_QQQQQQQQQQ", "MEMQ_FOO_BAR", "MEMQ_MEMORYY"])
def test_a_variable_like_no_setting_gets_no_guess(variable):
    """Never a group's name (it takes JSON, not a value): no guess at all."""
    assert unknown_env({variable: "x"}) == [(variable, None)]


def test_the_warning_without_a_guess_lists_the_groups_and_comes_once(monkeypatch, capsys):
    """`memq status` loads its settings twice (its own, its connection's): it
    printed each warning twice."""
    from memq.workers.cli import common

    monkeypatch.setattr(common, "_warned_env", False)
    monkeypatch.setenv("MEMQ_FOO_BAR", "1")
    monkeypatch.setenv("MEMQ_QUERY__CACHE_TTLL", "1")
    common._warn_unknown_env()
    common._warn_unknown_env()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: MEMQ_FOO_BAR is not a memq setting, ignored: no such setting (settings are "
        "MEMQ_<GROUP>__<NAME>, the groups NATS, STREAMS, DATABASE, PERSISTENCE, MEMORY, CACHE, QUERY, INDEXING, "
        "RECALL, SUMMARIZER, FACTS, METRICS, EXPIRY, HTTP; `memq config` lists them all)",
        "warning: MEMQ_QUERY__CACHE_TTLL is not a memq setting, ignored; did you mean MEMQ_CACHE__TTL_S?",
    ]


def test_status_warns_once(tmp_path):
    """The command itself, as a user runs it (a dead NATS: it fails at once)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(MEMQ_DATA_DIR=str(tmp_path), MEMQ_NATS__URL="nats://127.0.0.1:1", MEMQ_FOO_BAR="1")
    out = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "memq"), "status"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1, out.stderr
    assert out.stderr.count("MEMQ_FOO_BAR is not a memq setting") == 1, out.stderr


@pytest.mark.parametrize(
    "variable",
    [
        "MEMQ_NATS__URL",
        "MEMQ_NATS__PORT",
        "MEMQ_NATS__TLS__CA_FILE",
        "MEMQ_NATS__TLS",  # a section as JSON
        "MEMQ_HTTP__APPS__support-bot__API_KEY",  # a key of a dict setting
        "MEMQ_EXPIRY__APPS__a",
        "MEMQ_CONFIG",
        "MEMQ_APP",
        f"{security.ENV_PREFIX}APP_MY_BOT",
        "PATH",
    ],
)
def test_settings_and_variables_read_on_purpose_are_not_warned_about(variable):
    assert unknown_env({variable: "x"}) == []


def test_every_variable_of_the_deployments_and_dev_scripts_is_known():
    """infra/ (compose, Kubernetes, the dev scripts) sets settings, and reads
    MEMQ_ variables of its own: a shell that sets those for it runs memq with
    them too. Neither is warned about; a typo there is."""
    files = [f for f in sorted((ROOT / "infra").rglob("*")) if f.is_file() and f.suffix in ("", ".sh", ".yaml", ".yml")]
    found = {m for f in files for m in re.findall(r"\bMEMQ_[A-Z0-9_]+", f.read_text())}
    assert found, "the pattern finds nothing"
    found = {m for m in found if not m.endswith("_")}  # MEMQ_NATS_PASSWORD_<USER>: a prefix, in prose
    names, _ = env_names()
    stream_names = {
        "MEMQ_EVENTS",
        "MEMQ_DLQ",
        "MEMQ_LEASES",
        "MEMQ_REBUILD",
        "MEMQ_ARTIFACTS",
    }  # subjects and streams, no variables
    unknown = sorted(v for v in found - stream_names if unknown_env({v: ""}))
    assert unknown == [], f"add them to OTHER_ENV (or fix the typo): {unknown}"
    assert security.ENV_PREFIX in OTHER_ENV_PREFIXES
    assert not (OTHER_ENV & names)  # none is a setting


@pytest.mark.parametrize("port", [-1, 65536, 99999])
@pytest.mark.parametrize("section", ["nats", "http", "metrics"])
def test_ports_out_of_range_are_refused_from_the_environment(monkeypatch, section, port):
    monkeypatch.setenv(f"MEMQ_{section.upper()}__PORT", str(port))
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert raised.value.errors()[0]["loc"] == (section, "port")


def test_the_embedded_nats_port_defaults_to_4222_and_is_set_by_the_environment(monkeypatch):
    assert Settings().nats.port == 4222
    monkeypatch.setenv("MEMQ_NATS__PORT", "0")
    assert Settings().nats.port == 0
