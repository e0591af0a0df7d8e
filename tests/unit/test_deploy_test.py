"""The deploy test's short form (infra/scripts/deploy_test; the whole run is
`bash infra/dev.sh deploy-test`, ~15 min, not in the test command).

Without Podman: what the test turns infra/k8s into for `podman kube play`
keeps every workload and secret reference of the rendered manifests, and the
check of the kinds Podman does not play (Services, PDBs, autoscalers, the
NetworkPolicy) catches a selector that matches nothing. With Podman and the
test's base images present (a run of the deploy test left them): the image
builds from infra/Dockerfile and a container of it answers. Skipped, never
failed, where those are missing: CI has no Podman.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import images  # infra/scripts/deploy_test, on pytest's pythonpath (pyproject.toml)
import kube
import pytest
import stack
from podctl import Failed

ROOT = Path(__file__).resolve().parents[2]

IMAGES = {
    "MEMQ_IMAGE": "localhost/memq-deploy-test-memq:unit",
    "NATS_IMAGE": images.NATS,
    "POSTGRES_IMAGE": images.POSTGRES,
    "REDIS_IMAGE": images.REDIS,
    "WEAVIATE_IMAGE": images.WEAVIATE,
}


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    if not kube.KUSTOMIZE.exists():
        pytest.skip("kustomize is not fetched (infra/scripts/fetch-schemas.sh)")
    return kube.render(IMAGES)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> stack.Secrets:
    return stack.make_secrets(tmp_path_factory.mktemp("deploy"), ROOT / ".venv" / "bin" / "memq")


def test_every_workload_is_played_with_its_secrets_inlined(rendered, secrets, tmp_path):
    plays = kube.convert(rendered, kube.secret_values(secrets), secrets.tls, tmp_path)
    want = {d["metadata"]["name"] for d in rendered if d["kind"] == "Deployment"} | {
        "nats-1",
        "nats-2",
        "nats-3",
        "memq-init",
    }
    assert set(plays) - {"configmaps"} == want
    pods = [d for docs in plays.values() for d in docs if d["kind"] in ("Pod", "Deployment")]
    ports = []
    for doc in pods:
        assert doc["metadata"]["name"].startswith("memq-deploy-test-kube-")
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
        for c in spec["containers"]:
            assert "envFrom" not in c  # inlined: Podman 4.3 would let it override env
            assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in c.get("env") or [])
            assert c["image"] in IMAGES.values()
            assert not any("subPath" in m or "subPathExpr" in m for m in c.get("volumeMounts") or [])
            ports += [p["hostPort"] for p in c.get("ports", [])]
        assert not any("secret" in v for v in spec.get("volumes", []))
    assert len(ports) == len(set(ports))  # Podman publishes every port: none may collide
    env = {e["name"]: e["value"] for e in plays["memq-init"][0]["spec"]["containers"][0]["env"]}
    # The Job's own env wins over envFrom, as in Kubernetes: admin, with its password.
    assert (env["MEMQ_NATS__USER"], env["MEMQ_NATS__PASSWORD"]) == ("admin", secrets.password("admin"))
    assert env["MEMQ_DATABASE__URL"].startswith("postgresql+asyncpg://memq@postgres:")  # memq-config, inlined
    # Each NATS pod reads its own node file as node.conf, beside k8s-pod.conf as nats.conf.
    node2 = tmp_path / "kube-nats-2-config"
    assert "server_name: nats-2" in (node2 / "node.conf").read_text()
    assert (node2 / "nats.conf").read_text() == (ROOT / "infra" / "nats" / "k8s-pod.conf").read_text()


def test_the_unplayed_kinds_are_checked_against_the_pods(rendered):
    assert kube.check_unplayed(rendered) == {
        "Service": 7,
        "PodDisruptionBudget": 7,
        "HorizontalPodAutoscaler": 4,
        "ScaledObject": 2,
        "NetworkPolicy": 1,
    }
    for kind, break_it in (
        ("Service", lambda d: d["spec"]["selector"].update({"app.kubernetes.io/component": "nothing"})),
        ("Service", lambda d: d["spec"]["ports"][0].update(targetPort="no-such-port")),
        ("PodDisruptionBudget", lambda d: d["spec"]["selector"]["matchLabels"].update(x="y")),
        ("ScaledObject", lambda d: d["spec"]["scaleTargetRef"].update(name="memq-gone")),
        ("NetworkPolicy", lambda d: d["spec"]["podSelector"]["matchLabels"].update(x="y")),
    ):
        broken = copy.deepcopy(rendered)
        break_it(next(d for d in broken if d["kind"] == kind))
        with pytest.raises(Failed):
            kube.check_unplayed(broken)


def podman_ready() -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "image", "exists", images.PYTHON], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not podman_ready(), reason="needs Podman and the deploy test's base image (bash infra/dev.sh deploy-test)"
)
def test_the_image_builds_and_a_container_answers():
    tag = images.memq_image()  # the layer cache makes a rebuild quick
    facts = images.check_memq_image(tag)  # uid 10001, no compiler, every command starts
    assert facts["uid"] == 10001 and facts["size_mb"] > 100
