"""The NATS monitoring port (issue 27, item 4): plain HTTP without auth whose
``/connz?auth=true&subs=detail`` lists every tenant, its traffic and its live
reply subjects. What memq ships must not serve it beyond the host: the node
configs of infra/nats (and their Kubernetes copy) bind it to loopback, the
Kubernetes pods only behind a NetworkPolicy on a Service of its own, and
`memq up`'s embedded server serves no monitoring at all.

Checked on the real nats-server: its listening sockets, read from /proc.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme
import yaml
from helpers import make_settings

from memq.workers.runtime.embedded_nats import EmbeddedNats

ROOT = Path(__file__).parents[2]
NATS_DIR = ROOT / "infra" / "nats"
K8S = ROOT / "infra" / "k8s"
NATS_SERVER = Path(sys.prefix) / "bin" / "nats-server"
BCRYPT = '"$2b$04$abcdefghijklmnopqrstuuCFq6BDvtdlA7W8RUcv4Gqg3E2WyJ/Hy"'

pytestmark = pytest.mark.timeout(120)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(m.group(1))
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints the address as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(pid: int, port: int, proc: subprocess.Popen, log: Path) -> set[tuple[str, int]]:
    deadline = time.monotonic() + 20
    while True:
        found = listening(pid)
        if any(p == port for _, p in found):
            return found
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, f"nothing listens on {port}: {found}\n{log.read_text()[-2000:]}"
        time.sleep(0.05)


def conf_http(text: str) -> str:
    values = re.findall(r"^\s*http\s*[:=]\s*\"?([^\"\s#]+)", text, re.MULTILINE)
    assert values, "no http (monitoring) listen"
    return values[-1]  # nats-server keeps the last


@pytest.mark.parametrize("node", [1, 2, 3])
def test_a_shipped_node_config_serves_monitoring_on_loopback_only(node: int, tmp_path: Path):
    """The node config, run by nats-server with only its ports, paths and
    certificates replaced: the monitoring socket it opens is on loopback."""
    text = (NATS_DIR / f"node-{node}.conf").read_text()
    host, port = conf_http(text).rsplit(":", 1)
    assert port == "8222"
    ca = trustme.CA()
    cert = ca.issue_cert("nats-1", "nats-2", "nats-3", "localhost")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    monitor = free_port()
    text = (
        text.replace("/etc/nats/tls/", f"{tmp_path}/")
        .replace("/data/jetstream", str(tmp_path / "js"))
        .replace("0.0.0.0:4222", f"127.0.0.1:{free_port()}")  # not under test: kept off the network
        .replace("0.0.0.0:6222", f"127.0.0.1:{free_port()}")
        .replace(f"http: {host}:8222", f"http: {host}:{monitor}")  # the host is the config's own
    )
    (tmp_path / "nats.conf").write_text(text)
    (tmp_path / "accounts.conf").write_text((NATS_DIR / "accounts.conf").read_text())
    env = {n: BCRYPT for n in re.findall(r"password: \$(\w+)", (NATS_DIR / "accounts.conf").read_text())}
    log = tmp_path / "nats.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(NATS_SERVER), "-c", str(tmp_path / "nats.conf")], cwd=tmp_path, env=env, stdout=out, stderr=out
        )
    try:
        found = wait_listening(proc.pid, monitor, proc, log)
    finally:
        proc.terminate()
        proc.wait(10)
    monitors = {addr for addr, p in found if p == monitor}
    assert monitors and all(ipaddress.ip_address(a).is_loopback for a in monitors), (
        f"node-{node}.conf serves /connz on {monitors}: every tenant's connections to anyone who reaches it"
    )


def test_the_kubernetes_copy_is_the_same_and_the_pod_wrapper_is_fenced():
    (configmap,) = [d for d in yaml.safe_load_all((K8S / "nats-config.yaml").read_text()) if d]
    for node in (1, 2, 3):
        assert ipaddress.ip_address(conf_http(configmap["data"][f"node-{node}.conf"]).rsplit(":", 1)[0]).is_loopback
    docs = [d for d in yaml.safe_load_all((K8S / "nats.yaml").read_text()) if d]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for name, service in services.items():
        ports = {p["port"] for p in service["spec"]["ports"]}
        if 4222 in ports:
            assert 8222 not in ports, f"Service {name} puts the monitoring port beside the clients' port"
    assert {p["port"] for p in services["nats-monitor"]["spec"]["ports"]} == {8222}
    # k8s-pod.conf binds the pod: only with a NetworkPolicy whose monitoring rule names who may come
    assert conf_http(configmap["data"]["k8s-pod.conf"]).startswith("0.0.0.0:")
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rules = [r for r in policy["spec"]["ingress"] if {p["port"] for p in r.get("ports", [])} & {"monitor", 8222}]
    assert rules and all(r.get("from") and all("ipBlock" not in peer for peer in r["from"]) for r in rules)


def test_memq_up_serves_no_monitoring_beyond_loopback(tmp_path: Path):
    settings = make_settings("nats://unused", f"sqlite+aiosqlite:///{tmp_path}/memq.db", tmp_path)
    server = EmbeddedNats(settings, port=0)
    url = server.start()
    try:
        assert server.process is not None
        port = int(url.rsplit(":", 1)[1])
        found = listening(server.process.pid)
    finally:
        server.stop()
    assert ("127.0.0.1", port) in found
    assert all(ipaddress.ip_address(a).is_loopback for a, _ in found), found
    assert {p for _, p in found} == {port}, f"memq up's nats-server listens on more than its client port: {found}"
