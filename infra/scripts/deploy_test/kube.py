"""infra/k8s through `podman kube play` (issue 39, item 5), as far as Podman
4.3 plays Kubernetes: kustomize renders the kustomization (what `kubectl
apply -k` applies), the images are set to the ones built here (what
`kustomize edit set image` does), and then what Podman 4.3 cannot play is
turned into what it can, each change named in :data:`CHANGES`. PostgreSQL,
Redis and Weaviate are "your own" in infra/k8s: plain containers here, on the
same network, under the names memq-config points at. The agent outside runs
the same client check as against Compose; the kinds Podman does not play at
all are checked against what did play (:func:`check_unplayed`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import stack
import yaml
from podctl import PREFIX, Failed, podman, say, wait_exit
from podctl import run as sh

ROOT = Path(__file__).resolve().parents[3]
KUSTOMIZE = Path.home() / ".cache" / "memq-tools" / "infra-check" / "bin" / "kustomize"
NETWORK = f"{PREFIX}-kube"
SUBNET = "10.89.177"  # .0/24; the servers and NATS pods get fixed addresses (hostAliases)
ADDRESSES = {"postgres": 10, "redis": 11, "weaviate": 12, "nats-1": 21, "nats-2": 22, "nats-3": 23}
NATS_HOST_PORTS = {1: 14222, 2: 14223, 3: 14224}
HTTP_HOST_PORT = 18480
PLAYED = ("ConfigMap", "Deployment", "Pod", "PersistentVolumeClaim")
NOT_PLAYED = ("Namespace", "Service", "NetworkPolicy", "HorizontalPodAutoscaler", "ScaledObject", "PodDisruptionBudget")
CHANGES = [
    "StatefulSet nats: played as its three Pods nats-1..3 (Podman 4.3 plays no StatefulSet), each with its own "
    "PersistentVolumeClaim for volumeClaimTemplates; its ConfigMap files (subPath, and subPathExpr $(POD_NAME).conf) "
    "written from the rendered ConfigMap into a folder mounted at /etc/nats (Podman 4.3 mounts a whole ConfigMap "
    "as a directory where subPath names one key: 'read /etc/nats/nats.conf: is a directory')",
    "Job memq-init: played as its Pod (Podman 4.3 plays no Job); restartPolicy OnFailure as in the Job",
    "Deployments: played as Deployments; Podman runs one pod of each (replicas ignored)",
    "Secrets: values inlined into env, Secret volumes mounted by hostPath (Podman 4.3.1 crashes on a Secret volume, "
    "nil dereference in VolumeFromSecret, and cannot read a Secret for envFrom/secretKeyRef: 'not valid JSON')",
    "envFrom: inlined into env with Kubernetes' precedence (Podman 4.3 lets envFrom override env)",
    "Services: none (Podman plays no Service): the pods reach nats-1..3, postgres, redis and weaviate by hostAliases "
    "to fixed addresses on one network; the agent reaches NATS and the gateway by hostPort on 127.0.0.1",
    "ports: Podman 4.3 publishes every containerPort on the host (its own number when hostPort is unset), which "
    "collides between pods: each port gets a hostPort of its own on 127.0.0.1",
    "names: every pod, volume and container prefixed memq-deploy-test-kube-",
]


def render(images: dict[str, str]) -> list[dict[str, Any]]:
    if not KUSTOMIZE.exists():
        sh(["bash", str(ROOT / "infra" / "scripts" / "fetch-schemas.sh")], timeout=1800)
    text = sh([str(KUSTOMIZE), "build", str(ROOT / "infra" / "k8s")], quiet=True).stdout
    text = text.replace("image: memq:0.1.0", f"image: {images['MEMQ_IMAGE']}")
    text = text.replace("image: nats:2.15.1-alpine", f"image: {images['NATS_IMAGE']}")
    return [d for d in yaml.safe_load_all(text) if d]


def secret_values(s: stack.Secrets) -> dict[str, dict[str, str]]:
    """secrets.template.yaml filled in, as an operator's copy would be."""
    template = [d for d in yaml.safe_load_all((ROOT / "infra" / "k8s" / "secrets.template.yaml").read_text()) if d]
    fill = {
        "memq-secrets": {
            "MEMQ_NATS__PASSWORD": s.password("workers"),
            "MEMQ_DATABASE__PASSWORD": s.postgres,
            "MEMQ_CACHE__REDIS_PASSWORD": s.redis,
            "MEMQ_INDEXING__WEAVIATE__API_KEY": s.weaviate,
        },
        "memq-nats-admin": {"MEMQ_NATS__PASSWORD": s.password("admin")},
        "memq-http": {
            "MEMQ_HTTP__APPS": json.dumps(
                {stack.APP: {"api_key": s.api_key, "nats_password": s.password(f"app-{stack.APP}")}}
            )
        },
        "memq-nats-server": dict(s.accounts["server_env"]),
    }
    for doc in template:
        name, keys = doc["metadata"]["name"], set(doc.get("stringData") or {})
        if name not in fill or not keys <= set(fill[name]):
            raise Failed(f"secrets.template.yaml: Secret {name} has keys {sorted(keys)} the test does not fill")
    return fill


def inline_env(spec: dict[str, Any], sources: dict[str, dict[str, str]], tls: Path) -> None:
    """envFrom (ConfigMaps and Secrets) and secretKeyRef as plain env, with
    Kubernetes' precedence: env over envFrom, a later envFrom source over an
    earlier one. (Podman 4.3 lets envFrom override env: the init Job's
    MEMQ_NATS__USER=admin lost to memq-config's `workers`.)"""
    for c in spec.get("containers", []):
        merged: dict[str, dict[str, Any]] = {}
        for ref in c.pop("envFrom", None) or []:
            source = ref.get("configMapRef") or ref["secretRef"]
            merged.update({k: {"name": k, "value": v} for k, v in sources[source["name"]].items()})
        for e in c.get("env") or []:
            if "secretKeyRef" in (e.get("valueFrom") or {}):
                ref = e.pop("valueFrom")["secretKeyRef"]
                e["value"] = sources[ref["name"]][ref["key"]]
            merged[e["name"]] = e
        c["env"] = list(merged.values())
    for v in spec.get("volumes", []):
        if "secret" in v:
            if v.pop("secret")["secretName"] != "memq-nats-tls":
                raise Failed(f"a Secret volume the test cannot mount: {v}")
            v["hostPath"] = {"path": str(tls), "type": "Directory"}


def host_aliases() -> list[dict[str, Any]]:
    return [{"ip": f"{SUBNET}.{n}", "hostnames": [name]} for name, n in ADDRESSES.items()]


def convert(
    docs: list[dict[str, Any]], secrets: dict[str, dict[str, str]], tls: Path, work: Path
) -> dict[str, list[dict[str, Any]]]:
    """What Podman 4.3 plays, one list of documents per `podman kube play` (in order)."""
    configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
    plays: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        if d["kind"] == "StatefulSet":
            for n in range(d["spec"]["ordinals"]["start"], d["spec"]["ordinals"]["start"] + d["spec"]["replicas"]):
                node = f"nats-{n}"
                spec = copy.deepcopy(d["spec"]["template"]["spec"])
                c = spec["containers"][0]
                for e in c["env"]:
                    if e["name"] == "POD_NAME":
                        e.pop("valueFrom")
                        e["value"] = node
                # subPath mounts of the ConfigMap, as files of a folder (Podman 4.3
                # mounts the whole ConfigMap where a subPath names one key).
                config = next(v for v in spec["volumes"] if v["name"] == "config")["configMap"]
                data = next(cm for cm in configmaps if cm["metadata"]["name"] == config["name"])["data"]
                keys = {i["path"]: i["key"] for i in config["items"]}
                folder = work / f"kube-{node}-config"
                (folder / "tls").mkdir(
                    parents=True, exist_ok=True
                )  # the mount point of the certificates (read-only above)
                kept = []
                for m in c["volumeMounts"]:
                    if m["name"] != "config":
                        kept.append(m)
                        continue
                    sub = m.pop("subPath", None) or m.pop("subPathExpr").replace("$(POD_NAME)", node)
                    (folder / Path(m["mountPath"]).name).write_text(data[keys[sub]])
                c["volumeMounts"] = [{"name": "config", "mountPath": "/etc/nats", "readOnly": True}, *kept]
                spec["volumes"] = [
                    {"name": "config", "hostPath": {"path": str(folder), "type": "Directory"}}
                    if v["name"] == "config"
                    else v
                    for v in spec["volumes"]
                ]
                claims = []
                for t in d["spec"]["volumeClaimTemplates"]:
                    claim = f"{PREFIX}-kube-{t['metadata']['name']}-{node}"
                    claims.append(
                        {
                            "apiVersion": "v1",
                            "kind": "PersistentVolumeClaim",
                            "metadata": {"name": claim},
                            "spec": t["spec"],
                        }
                    )
                    spec["volumes"].append(
                        {"name": t["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}}
                    )
                for p in c["ports"]:
                    if p["name"] == "client":
                        p.update(hostPort=NATS_HOST_PORTS[n], hostIP="127.0.0.1")
                labels = {**d["spec"]["template"]["metadata"]["labels"], "statefulset.kubernetes.io/pod-name": node}
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{PREFIX}-kube-{node}", "labels": labels},
                    "spec": spec,
                }
                plays[node] = [*claims, pod]
        elif d["kind"] == "Job":
            spec = copy.deepcopy(d["spec"]["template"]["spec"])
            labels = d["spec"]["template"]["metadata"]["labels"]
            plays["memq-init"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{PREFIX}-kube-memq-init", "labels": labels},
                    "spec": spec,
                }
            ]
        elif d["kind"] == "Deployment":
            d = copy.deepcopy(d)
            kind = d["metadata"]["name"]
            d["metadata"]["name"] = f"{PREFIX}-kube-{kind}"
            if kind == "memq-http":
                for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]:
                    if p["name"] == "http":
                        p.update(hostPort=HTTP_HOST_PORT, hostIP="127.0.0.1")
            plays[kind] = [d]
    spare = iter(range(24000, 25000))
    for docs_ in plays.values():
        for doc in docs_:
            spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc.get("spec", {})
            for c in spec.get("containers", []):
                for p in c.get("ports", []):
                    p.setdefault("hostPort", next(spare))
                    p.setdefault("hostIP", "127.0.0.1")
            if doc["kind"] in ("Pod", "Deployment"):
                inline_env(spec, {**{cm["metadata"]["name"]: cm["data"] for cm in configmaps}, **secrets}, tls)
                spec["hostAliases"] = host_aliases()
                spec.pop("topologySpreadConstraints", None)  # one host
    return {"configmaps": configmaps, **plays}


def check_unplayed(docs: list[dict[str, Any]]) -> dict[str, int]:
    """What Podman does not play, checked against what did: each Service and
    PDB selects pods that exist (and a Service's targetPort is a port of
    theirs), each HPA and ScaledObject scales a Deployment of the render,
    the NetworkPolicy selects the NATS pods and admits the ports they serve.
    (The schemas and KEDA's CRD: tests/unit/test_infra.py.)"""
    templates = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            templates.append(d["spec"]["template"])
        elif d["kind"] == "StatefulSet":
            for n in range(d["spec"]["ordinals"]["start"], d["spec"]["ordinals"]["start"] + d["spec"]["replicas"]):
                t = copy.deepcopy(d["spec"]["template"])
                t["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = f"nats-{n}"
                templates.append(t)

    def selected(selector: dict[str, str]) -> list[dict[str, Any]]:
        return [
            t for t in templates if selector and all(t["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]

    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    counted: dict[str, int] = {}
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "Service":
            pods = selected(d["spec"].get("selector") or {})
            ports = {p.get("name") for t in pods for c in t["spec"]["containers"] for p in c.get("ports", [])} | {
                p["containerPort"] for t in pods for c in t["spec"]["containers"] for p in c.get("ports", [])
            }
            if not pods or any(p.get("targetPort", p["port"]) not in ports for p in d["spec"]["ports"]):
                raise Failed(
                    f"Service {name} selects {len(pods)} pods, ports {d['spec']['ports']} of {sorted(map(str, ports))}"
                )
        elif kind == "PodDisruptionBudget":
            if not selected(d["spec"]["selector"]["matchLabels"]):
                raise Failed(f"PodDisruptionBudget {name} selects no pod")
        elif kind in ("HorizontalPodAutoscaler", "ScaledObject"):
            target = d["spec"]["scaleTargetRef"]["name"]
            if target not in deployments:
                raise Failed(f"{kind} {name} scales {target}, not a Deployment of infra/k8s")
        elif kind == "NetworkPolicy":
            if len(selected(d["spec"]["podSelector"]["matchLabels"])) != 3:
                raise Failed(f"NetworkPolicy {name} does not select the three NATS pods")
        else:
            continue
        counted[kind] = counted.get(kind, 0) + 1
    return counted


def play(work: Path, name: str, docs: list[dict[str, Any]], configmaps: list[Path], ip: str | None) -> Path:
    path = work / f"kube-{name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    args = ["kube", "play", "--network", NETWORK, *(a for c in configmaps for a in ("--configmap", str(c)))]
    podman(*args, *(["--ip", ip] if ip else []), str(path), timeout=600)
    return path


def server(name: str, image: str, env: dict[str, str], *args: str) -> None:
    podman(
        "run",
        "-d",
        "--name",
        f"{PREFIX}-kube-{name}",
        "--network",
        NETWORK,
        "--ip",
        f"{SUBNET}.{ADDRESSES[name]}",
        *(a for k, v in env.items() for a in ("-e", f"{k}={v}")),
        image,
        *args,
        quiet=True,
    )


def container(pod_prefix: str, name: str) -> str:
    found = [
        n
        for n in podman("ps", "-a", "--format", "{{.Names}}", quiet=True).stdout.split()
        if n.startswith(pod_prefix) and n.endswith("-" + name)
    ]
    if len(found) != 1:
        raise Failed(f"no single container {pod_prefix}*-{name}: {found}")
    return found[0]


def ready(name: str, url: str, timeout: float = 300) -> None:
    """The pod's readinessProbe, run by hand (Podman runs no readiness probe)."""
    probe = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=3)"
    deadline = time.monotonic() + timeout
    while podman("exec", name, "python", "-c", probe, check=False, quiet=True).returncode != 0:
        if time.monotonic() > deadline:
            raise Failed(
                f"{name} not ready ({url}) in {timeout:.0f} s:\n"
                + podman("logs", "--tail", "15", name, check=False, quiet=True).stderr
            )
        time.sleep(2)


def run_kube(s: stack.Secrets, images: dict[str, str], work: Path, keep: bool = False) -> dict[str, object]:
    started = time.monotonic()
    docs = render(images)
    kinds = sorted({d["kind"] for d in docs})
    say(f"kustomize build infra/k8s: {len(docs)} documents, kinds {', '.join(kinds)}")
    unplayed = check_unplayed(docs)
    say(f"not played by Podman, checked against the played pods: {unplayed}")
    plays = convert(docs, secret_values(s), s.tls, work)
    down(work)
    podman("network", "create", "--subnet", f"{SUBNET}.0/24", NETWORK, quiet=True)
    configmaps = []
    for cm in plays.pop("configmaps"):
        path = work / f"configmap-{cm['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(cm))
        configmaps.append(path)
    server(
        "postgres",
        images["POSTGRES_IMAGE"],
        {"POSTGRES_USER": "memq", "POSTGRES_DB": "memq", "POSTGRES_PASSWORD": s.postgres},
    )
    server(
        "redis", images["REDIS_IMAGE"], {}, "redis-server", "--requirepass", s.redis, "--save", "", "--appendonly", "no"
    )
    server(
        "weaviate",
        images["WEAVIATE_IMAGE"],
        {
            "PERSISTENCE_DATA_PATH": "/var/lib/weaviate",
            "DEFAULT_VECTORIZER_MODULE": "none",
            "ENABLE_MODULES": "",
            "AUTOSCHEMA_ENABLED": "false",
            "CLUSTER_HOSTNAME": "node1",
            "DISABLE_TELEMETRY": "true",
            "AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED": "false",
            "AUTHENTICATION_APIKEY_ENABLED": "true",
            "AUTHENTICATION_APIKEY_ALLOWED_KEYS": s.weaviate,
            "AUTHENTICATION_APIKEY_USERS": "memq",
            "AUTHORIZATION_ADMINLIST_ENABLED": "true",
            "AUTHORIZATION_ADMINLIST_USERS": "memq",
        },
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--scheme",
        "http",
    )
    for node in ("nats-1", "nats-2", "nats-3"):
        play(work, node, plays.pop(node), configmaps, f"{SUBNET}.{ADDRESSES[node]}")
    for node in ("nats-1", "nats-2", "nats-3"):
        nats_ready(node)
    play(work, "memq-init", plays.pop("memq-init"), configmaps, None)
    code = wait_exit(container(f"{PREFIX}-kube-memq-init", "init"), 300)
    if code != 0:
        raise Failed(f"the memq-init pod exited {code}")
    for kind, docs_ in plays.items():
        play(work, kind, docs_, configmaps, None)
    for kind in plays:
        short = kind.removeprefix("memq-")
        ready(container(f"{PREFIX}-kube-{kind}", short), "http://127.0.0.1:9464/readyz")
    say(f"kube play: every pod ready in {time.monotonic() - started:.0f} s")
    import agent

    urls = [f"tls://localhost:{p}" for p in NATS_HOST_PORTS.values()]
    check = asyncio.run(
        agent.client_check(
            urls,
            s.tls / "ca.crt",
            stack.APP,
            s.password(f"app-{stack.APP}"),
            f"http://127.0.0.1:{HTTP_HOST_PORT}",
            s.api_key,
        )
    )
    pods = sorted(
        n for n in podman("pod", "ps", "--format", "{{.Name}}", quiet=True).stdout.split() if n.startswith(PREFIX)
    )
    if not keep:
        down(work)
    return {
        "played_kinds": list(PLAYED),
        "not_played_checked": unplayed,
        "changes": CHANGES,
        "pods": pods,
        "client_check": check,
    }


def nats_ready(node: str, timeout: float = 180) -> None:
    """The NATS pod's readinessProbe (/healthz?js-server-only=true on the monitoring port), run by hand."""
    name = container(f"{PREFIX}-kube-{node}", "nats")
    ready(name, "http://127.0.0.1:8222/healthz?js-server-only=true", timeout)


def down(work: Path) -> None:
    """The pods, containers, volumes and network the kube step made (by name)."""
    for pod in podman("pod", "ps", "--format", "{{.Name}}", quiet=True).stdout.split():
        if pod.startswith(f"{PREFIX}-kube-"):
            podman("pod", "rm", "-f", "-t", "5", pod, check=False, quiet=True)
    for name in podman("ps", "-a", "--format", "{{.Names}}", quiet=True).stdout.split():
        if name.startswith(f"{PREFIX}-kube-"):
            podman("rm", "-f", "-t", "5", name, check=False, quiet=True)
    for volume in podman("volume", "ls", "--format", "{{.Name}}", quiet=True).stdout.split():
        if volume.startswith(f"{PREFIX}-kube-"):
            podman("volume", "rm", "-f", volume, check=False, quiet=True)
    if podman("network", "exists", NETWORK, check=False, quiet=True).returncode == 0:
        podman("network", "rm", "-f", NETWORK, check=False, quiet=True)


run = run_kube  # deploy_test.py calls kube.run(...)
