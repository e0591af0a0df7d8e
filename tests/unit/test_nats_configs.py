"""The production NATS configs in infra/nats/ and what `memq nats accounts`
writes are valid for the real nats-server (``nats-server -t``)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

ROOT = Path(__file__).parents[2]
INFRA = ROOT / "infra" / "nats"
NATS_SERVER = Path(sys.prefix) / "bin" / "nats-server"
MEMQ = Path(sys.prefix) / "bin" / "memq"


def check(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(NATS_SERVER), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        cwd=config.parent,
    )


def memq_accounts(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MEMQ), "nats", "accounts", *args], capture_output=True, text=True, timeout=60, cwd=tmp)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """`memq nats accounts` for two apps, once with hashes and once with $VAR references."""
    tmp = tmp_path_factory.mktemp("accounts")
    for out, extra in (("hashed.conf", []), ("env.conf", ["--env-passwords"])):
        result = memq_accounts(tmp, "--app", "support-bot", "--app", "b.c", "--out", out, *extra)
        assert result.returncode == 0, result.stderr
    return tmp


def test_example_accounts_conf_is_what_the_command_writes(tmp_path):
    result = memq_accounts(tmp_path, "--app", "support-bot", "--app", "billing-agent", "--env-passwords")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "accounts.conf").read_text() == (INFRA / "accounts.conf").read_text()


def test_passwords_go_to_a_private_file_only(generated: Path, tmp_path):
    result = memq_accounts(tmp_path, "--app", "a")
    secrets = json.loads((tmp_path / "accounts.conf.secrets.json").read_text())
    assert stat.S_IMODE((tmp_path / "accounts.conf.secrets.json").stat().st_mode) == 0o600
    for user in secrets["users"].values():
        assert user["password"] not in result.stdout + result.stderr
        assert user["password"] not in (tmp_path / "accounts.conf").read_text()
    again = memq_accounts(tmp_path, "--app", "a")
    assert again.returncode == 1 and "exists" in again.stderr and "--force" in again.stderr
    assert memq_accounts(tmp_path, "--app", "a", "--force").returncode == 0
    assert json.loads((tmp_path / "accounts.conf.secrets.json").read_text()) != secrets  # new passwords


def test_generated_configs_are_valid(generated: Path):
    assert check(generated / "hashed.conf").returncode == 0
    env = json.loads((generated / "env.conf.secrets.json").read_text())["server_env"]
    ok = check(generated / "env.conf", env)
    assert ok.returncode == 0, ok.stderr
    missing = check(generated / "env.conf")  # fails closed without the passwords
    assert missing.returncode != 0 and "MEMQ_NATS_PASSWORD_WORKERS" in missing.stderr


def test_bad_app_ids_are_refused(tmp_path):
    result = memq_accounts(tmp_path, "--app", "a", "--app", "a")
    assert result.returncode == 2 and "twice" in result.stderr
    assert not (tmp_path / "accounts.conf").exists()
    # An id the contract refuses (InvalidId, no ValueError): one line, not a traceback.
    empty = memq_accounts(tmp_path, "--app", "")
    assert empty.returncode == 2 and "app must not be empty" in empty.stderr and "Traceback" not in empty.stderr
    assert not (tmp_path / "accounts.conf").exists()


@pytest.mark.parametrize("node", [1, 2, 3])
def test_production_node_configs_are_valid(node: int, tmp_path: Path):
    # The files point at /etc/nats/tls and /data: point them at throwaway
    # certificates and a temporary store, and change nothing else.
    ca = trustme.CA()
    cert = ca.issue_cert("nats-1", "nats-2", "nats-3", "localhost")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    text = (INFRA / f"node-{node}.conf").read_text()
    assert f"server_name: nats-{node}" in text and "include accounts.conf" in text
    assert re.search(r"listen: 0\.0\.0\.0:4222", text) and "0.0.0.0:6222" in text
    assert "http: 127.0.0.1:8222" in text  # monitoring: loopback (k8s-pod.conf binds the pod)
    text = text.replace("/etc/nats/tls/", f"{tmp_path}/").replace("/data/jetstream", str(tmp_path / "js"))
    (tmp_path / "nats.conf").write_text(text)
    (tmp_path / "accounts.conf").write_text((INFRA / "accounts.conf").read_text())
    names = re.findall(r"password: \$(\w+)", (INFRA / "accounts.conf").read_text())
    assert len(names) == 5
    env = {n: '"$2b$04$abcdefghijklmnopqrstuuCFq6BDvtdlA7W8RUcv4Gqg3E2WyJ/Hy"' for n in names}
    result = check(tmp_path / "nats.conf", env)
    assert result.returncode == 0, result.stderr
    # as a Kubernetes pod reads it: k8s-pod.conf, with the node's config as node.conf
    (tmp_path / "node.conf").write_text(text)
    (tmp_path / "pod.conf").write_text((INFRA / "k8s-pod.conf").read_text())
    result = check(tmp_path / "pod.conf", env)
    assert result.returncode == 0, result.stderr


def test_upgrading_with_reuse_keeps_every_password_and_adds_accounts(tmp_path):
    """An existing deployment regenerates its config: the same users and
    passwords (clients change nothing), each app now in its own account."""
    assert memq_accounts(tmp_path, "--app", "a").returncode == 0
    secrets = tmp_path / "accounts.conf.secrets.json"
    before = json.loads(secrets.read_text())
    (tmp_path / "old.json").write_text(secrets.read_text())
    result = memq_accounts(tmp_path, "--app", "a", "--app", "b", "--force", "--reuse", "old.json")
    assert result.returncode == 0, result.stderr
    after = json.loads(secrets.read_text())
    for name, user in before["users"].items():
        assert after["users"][name]["password"] == user["password"], name
    assert (
        before["server_env"].items() <= after["server_env"].items()
    )  # the same hashes: the server needs no new secret
    assert after["users"]["app-a"]["account"] == "APP_a" and after["users"]["workers"]["account"] == "MEMQ"
    assert check(tmp_path / "accounts.conf").returncode == 0
    assert "kept the passwords of" in result.stdout and "app-b" not in result.stdout.split("kept")[1]
    bad = memq_accounts(tmp_path, "--app", "a", "--force", "--reuse", "missing.json")
    assert bad.returncode == 2 and "missing.json" in bad.stderr
