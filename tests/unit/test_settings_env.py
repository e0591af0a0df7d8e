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
    ],
)
def test_a_misspelled_variable_gets_the_closest_setting(variable, closest):
    assert unknown_env({variable: "x"}) == [(variable, closest)]


def test_a_variable_like_no_setting_gets_no_guess():
    assert unknown_env({"MEMQ_QQQQQQQQQQ": "x"}) == [("MEMQ_QQQQQQQQQQ", None)]


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
