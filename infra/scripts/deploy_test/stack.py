"""The secrets a deployment needs, made fresh for each run (NATS accounts from
`memq nats accounts --env-passwords`, throwaway TLS certificates, random
passwords and an app's API key), and infra/compose.yaml brought up with them
through podman-compose.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from podctl import PROJECT, Failed, compose, containers, healthy, logs_tail, podman, run, say, wait_exit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
COMPOSE_FILES = [ROOT / "infra" / "compose.yaml", ROOT / "infra" / "compose.podman.yaml"]
APP = "support-bot"
SERVERS = ("nats-1", "nats-2", "nats-3", "postgres", "redis", "weaviate")
WORKERS = ("persistence", "indexing", "summarizer", "query", "http")
NATS_URLS = ["tls://localhost:4222", "tls://localhost:4223", "tls://localhost:4224"]


@dataclass
class Secrets:
    """Everything the stack and the outside agent need, under work/."""

    dir: Path
    accounts: dict = field(default_factory=dict)
    postgres: str = ""
    redis: str = ""
    weaviate: str = ""
    api_key: str = ""

    @property
    def tls(self) -> Path:
        return self.dir / "tls"

    def password(self, user: str) -> str:
        return str(self.accounts["users"][user]["password"])


def make_secrets(work: Path, memq: Path) -> Secrets:
    """Accounts as `memq nats accounts` writes them (checked equal to the shipped
    accounts.conf, which compose.yaml mounts), certificates for nats-1..3 and
    localhost, and random passwords."""
    import trustme  # the tests' certificate maker, in the shared venv

    s = Secrets(work / "secrets")
    s.tls.mkdir(parents=True, exist_ok=True)
    run(
        [
            str(memq),
            "nats",
            "accounts",
            "--env-passwords",
            "--force",
            "-a",
            APP,
            "-a",
            "billing-agent",
            "-o",
            str(s.dir / "accounts.conf"),
        ],
        quiet=True,
    )
    if (s.dir / "accounts.conf").read_text() != (ROOT / "infra" / "nats" / "accounts.conf").read_text():
        raise Failed("infra/nats/accounts.conf is not what `memq nats accounts` writes for its two apps")
    s.accounts = json.loads((s.dir / "accounts.conf.secrets.json").read_text())
    ca = trustme.CA()
    cert = ca.issue_cert("nats-1", "nats-2", "nats-3", "nats", "localhost", "127.0.0.1")
    ca.cert_pem.write_to_path(str(s.tls / "ca.crt"))
    cert.private_key_pem.write_to_path(str(s.tls / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(s.tls / "tls.crt"))
    for f in s.tls.iterdir():
        f.chmod(0o644)  # read by the containers' users (a bind mount keeps the mode)
    s.postgres, s.redis, s.weaviate, s.api_key = (secrets.token_hex(24) for _ in range(4))
    return s


def compose_env(s: Secrets, images: dict[str, str]) -> dict[str, str]:
    """What infra/.env would hold, plus the locally built images."""
    return {
        "POSTGRES_PASSWORD": s.postgres,
        "REDIS_PASSWORD": s.redis,
        "WEAVIATE_API_KEY": s.weaviate,
        "NATS_WORKERS_PASSWORD": s.password("workers"),
        "NATS_ADMIN_PASSWORD": s.password("admin"),
        **s.accounts["server_env"],
        "MEMQ_HTTP_APPS": json.dumps({APP: {"api_key": s.api_key, "nats_password": s.password(f"app-{APP}")}}),
        "MEMQ_NATS_TLS_DIR": str(s.tls),
        **images,
    }


def name(service: str, replica: int = 1) -> str:
    return f"{PROJECT}_{service}_{replica}"


def replicas(service: str) -> list[str]:
    return containers(f"{PROJECT}_{service}_")


def up(env: dict[str, str]) -> None:
    """Bring the whole file up: podman-compose creates every container; Podman 4.3
    without systemd never runs a healthcheck, so the ordering compose.yaml asks
    for (servers healthy, then memq-init done, then the workers) is waited on
    here, service by service, with the file's own healthchecks."""
    started = time.monotonic()
    compose(COMPOSE_FILES, "up", "-d", *SERVERS, env=env, timeout=900)
    for service in SERVERS:
        healthy(name(service))
    say(f"servers healthy in {time.monotonic() - started:.0f} s: {', '.join(SERVERS)}")
    compose(COMPOSE_FILES, "up", "-d", "--no-deps", "memq-init", env=env, timeout=600)
    code = wait_exit(name("memq-init"), timeout=300)
    if code != 0:
        raise Failed(f"memq-init exited {code}:\n{logs_tail(name('memq-init'))}")
    say("memq-init exited 0:\n    " + "\n    ".join(logs_tail(name("memq-init"), 8).strip().splitlines()))
    compose(COMPOSE_FILES, "up", "-d", "--no-deps", *WORKERS, env=env, timeout=900)
    wait_workers()
    say(f"stack up in {time.monotonic() - started:.0f} s")


# Replicas that never became ready and were restarted once (see wait_workers).
STUCK: list[dict[str, str]] = []


def wait_workers(timeout: float = 240) -> None:
    """Every replica ready. One that is not within `timeout` is restarted once,
    loudly, its log kept in STUCK (seen here: of two indexing replicas starting
    together on an empty Weaviate, one stayed "preparing the search index"
    after the other had built it, with nothing more in its log)."""
    for service in WORKERS:
        names = replicas(service)
        want = 1 if service == "summarizer" else 2
        if len(names) != want:
            raise Failed(f"{service}: {len(names)} replicas ({names}), compose.yaml asks for {want}")
        for n in names:
            try:
                healthy(n, timeout=timeout)
            except Failed:
                log = logs_tail(n, 40)
                STUCK.append({"replica": n, "log": log})
                say(
                    f"WARNING: {n} not ready in {timeout:.0f} s; restarting it once. Its log ends:\n    "
                    + "\n    ".join(log.strip().splitlines()[-6:])
                )
                podman("restart", "-t", "10", n)
                healthy(n, timeout=timeout)
    say(
        "every worker replica ready (/readyz): "
        + ", ".join(n.removeprefix(PROJECT + "_") for s in WORKERS for n in replicas(s))
    )


def status(env: dict[str, str]) -> str:
    """`memq status` from inside the deployment (as the docs say: exec in a query replica)."""
    result = podman(
        "exec",
        "-e",
        "MEMQ_NATS__USER=admin",
        "-e",
        f"MEMQ_NATS__PASSWORD={env['NATS_ADMIN_PASSWORD']}",
        name("query"),
        "memq",
        "status",
    )
    return result.stdout


def down(env: dict[str, str]) -> None:
    """Every container, the network and the volumes of the project (and nothing else)."""
    compose(COMPOSE_FILES, "down", "-v", "-t", "5", env=env, check=False, timeout=600)
    left = containers(f"{PROJECT}_")
    if left:
        podman("rm", "-f", "-t", "5", *left, check=False)
    for volume in podman("volume", "ls", "--format", "{{.Name}}", quiet=True).stdout.split():
        if volume.startswith(f"{PROJECT}_"):
            podman("volume", "rm", "-f", volume, check=False)
    for network in podman("network", "ls", "--format", "{{.Name}}", quiet=True).stdout.split():
        if network.startswith(f"{PROJECT}_"):
            podman("network", "rm", "-f", network, check=False)


def check_streams(env: dict[str, str]) -> dict[str, int]:
    """Every stream memq init made has 3 replicas, each current, on 3 nodes."""
    import asyncio
    import ssl

    import nats

    async def streams() -> dict[str, int]:
        nc = await nats.connect(
            NATS_URLS,
            user="admin",
            password=env["NATS_ADMIN_PASSWORD"],
            tls=ssl.create_default_context(cafile=str(Path(env["MEMQ_NATS_TLS_DIR"]) / "ca.crt")),
        )
        try:
            found = {}
            for info in await nc.jetstream().streams_info():
                peers = [info.cluster.leader] + [r.name for r in info.cluster.replicas or [] if r.current]
                if info.config.num_replicas != 3 or len(set(peers)) != 3:
                    raise Failed(f"stream {info.config.name}: R{info.config.num_replicas}, current on {peers}")
                found[info.config.name] = len(set(peers))
            if missing := {"MEMQ_EVENTS", f"MEMQ_EVENTS_{APP}"} - found.keys():
                raise Failed(f"no {', '.join(sorted(missing))} stream: {sorted(found)}")
            return found
        finally:
            await nc.close()

    found = asyncio.run(streams())
    say(f"streams R3, current on nats-1..3: {', '.join(sorted(found))}")
    return found


def http_url(replica: int = 1) -> str:
    """The gateway replica's published address (compose.podman.yaml: a port of its own)."""
    out = podman("port", name("http", replica), "8480/tcp", quiet=True).stdout.split()[0]
    return "http://" + out.replace("0.0.0.0", "127.0.0.1")
