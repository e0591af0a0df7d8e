"""The images the deploy test runs, made here: no registry is reachable, so a
Debian base comes from debootstrap (kept between runs), the servers (NATS,
PostgreSQL, Redis, Weaviate) are built on it from Debian's packages and the
binaries memq's tests already use, and memq's own image from infra/Dockerfile
unchanged, with PYTHON_IMAGE pointing at the base.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from podctl import CACHE, PODMAN_COMPOSE_VERSION, PREFIX, Failed, image_exists, inspect, podman, run, say

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
BASE = f"localhost/{PREFIX}-base:bookworm"
PYTHON = f"localhost/{PREFIX}-python:bookworm"
NATS = f"localhost/{PREFIX}-nats:2.15.1"
POSTGRES = f"localhost/{PREFIX}-postgres:15"
REDIS = f"localhost/{PREFIX}-redis:7"
WEAVIATE = f"localhost/{PREFIX}-weaviate:1.38.8"
MEMQ = f"localhost/{PREFIX}-memq"  # tagged with the commit
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
# crun (and runc) refuse the default ulimits on these VMs; no systemd: cgroupfs.
CONTAINERS_CONF_TEXT = """\
# written by memq's deploy test (infra/scripts/deploy_test): see docs/operations/deploy.md
[containers]
default_ulimits = []
pids_limit = 0

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "make")


def prerequisites() -> None:
    """Podman, runc and debootstrap (apt, as root), containers.conf, podman-compose (its own venv)."""
    missing = [p for p in ("podman", "runc", "debootstrap") if shutil.which(p) is None]
    if missing:
        if os.geteuid() != 0:
            raise Failed(f"missing {', '.join(missing)}: run as root, or apt-get install -y podman runc debootstrap")
        say(f"installing {' '.join(missing)} with apt-get")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-q"], env=env, timeout=600)
        run(["apt-get", "install", "-y", "-q", "podman", "runc", "debootstrap"], env=env, timeout=1200)
    if not CONTAINERS_CONF.exists():
        say(f"writing {CONTAINERS_CONF} (runc, cgroupfs, no default ulimits)")
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(CONTAINERS_CONF_TEXT)
    compose = CACHE / "venv" / "bin" / "podman-compose"
    if not compose.exists():
        say(f"installing podman-compose {PODMAN_COMPOSE_VERSION} into {CACHE / 'venv'}")
        run([sys.executable, "-m", "venv", str(CACHE / "venv")])  # .venv's Python: no python3-venv needed
        run([str(CACHE / "venv" / "bin" / "pip"), "install", "-q", f"podman-compose=={PODMAN_COMPOSE_VERSION}"])
    say(
        podman("--version", quiet=True).stdout.strip()
        + ", "
        + run([str(compose), "--version"], quiet=True).stdout.split("\n")[0]
    )


def debian_mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources)."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        text = path.read_text() if path.is_file() else ""
        for url in re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(r"^deb\s+(?:\[[^]]*]\s+)?(\S+)", text, re.M):
            if "security" not in url:
                return url
    return "http://deb.debian.org/debian"


def base_image() -> None:
    """debootstrap bookworm (minbase) into a folder and import it; kept between runs."""
    if image_exists(BASE):
        say(f"{BASE}: present, reused")
        return
    mirror = debian_mirror()
    say(f"{BASE}: debootstrap bookworm from {mirror} (about a minute)")
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], timeout=1200)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "-", BASE], stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        if imported.returncode or tar.returncode:
            raise Failed(f"podman import {BASE}: {imported.stderr.strip()}")


def build(tag: str, containerfile: Path, context: Path, *extra: str) -> None:
    started = podman("image", "inspect", "--format", "{{.Id}}", tag, check=False, quiet=True).stdout.strip()
    podman("build", "--network", "host", "-f", str(containerfile), "-t", tag, *extra, str(context), timeout=3600)
    now = podman("image", "inspect", "--format", "{{.Id}}", tag, quiet=True).stdout.strip()
    say(f"{tag}: {'unchanged (layer cache)' if now == started else 'built'}, {size_mb(tag):.0f} MB")


def size_mb(tag: str) -> float:
    return int(inspect(tag)["Size"]) / 1e6


def server_images(work: Path) -> None:
    """The Python base (the stand-in for python:3.11-slim) and the four servers."""
    images = HERE / "images"
    ctx = work / "ctx"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "ca").mkdir(parents=True)
    # The host's extra CAs: apt and pip inside the builds go through the same egress.
    for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(crt, ctx / "ca" / crt.name)
    (ctx / "pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    for name in ("postgres-entrypoint.sh",):
        shutil.copy(images / name, ctx / name)
    shutil.copy(
        shutil.which("nats-server", path=str(ROOT / ".venv" / "bin")) or _need("nats-server"), ctx / "nats-server"
    )
    weaviate = run(["bash", str(ROOT / "infra" / "scripts" / "install-weaviate.sh")], timeout=3600).stdout.split()[-1]
    shutil.copy(weaviate, ctx / "weaviate-server")
    build(PYTHON, images / "python.Containerfile", ctx, "--build-arg", f"BASE_IMAGE={BASE}")
    for tag, name in ((NATS, "nats"), (POSTGRES, "postgres"), (REDIS, "redis"), (WEAVIATE, "weaviate")):
        build(tag, images / f"{name}.Containerfile", ctx, "--build-arg", f"PYTHON_IMAGE={PYTHON}")


def _need(what: str) -> str:
    raise Failed(f"{what} not found in .venv/bin (infra/dev.sh setup installs it)")


def commit() -> str:
    out = run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], quiet=True, check=False).stdout.strip()
    dirty = run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "contracts", "workers", "pyproject.toml"],
        quiet=True,
        check=False,
    )
    return (out or "dev") + ("-dirty" if dirty.stdout.strip() else "")


def memq_image() -> str:
    """infra/Dockerfile as shipped, on the Python base."""
    tag = f"{MEMQ}:{commit()}"
    build(
        tag,
        ROOT / "infra" / "Dockerfile",
        ROOT,
        "--ignorefile",
        str(ROOT / "infra" / "Dockerfile.dockerignore"),
        "--build-arg",
        f"PYTHON_IMAGE={PYTHON}",
    )
    return tag


def check_memq_image(tag: str) -> dict[str, object]:
    """Item 1: uid 10001, no compiler, every command starts; the size."""
    info = inspect(tag)
    user = info["Config"].get("User", "")
    uid = podman("run", "--rm", "--network", "none", "--entrypoint", "id", tag, "-u", quiet=True).stdout.strip()
    if uid != "10001" or not user.startswith("10001"):
        raise Failed(f"{tag} runs as {uid!r} (User {user!r}), not 10001")
    probe = "for c in " + " ".join(COMPILERS) + '; do command -v "$c"; done; true'
    found = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", tag, "-c", probe, quiet=True
    ).stdout.split()
    if found:
        raise Failed(f"{tag} contains a compiler or build tool: {found}")
    for command in (["--help"], ["init", "--help"], ["status", "--help"]) + tuple(
        ["worker", kind, "--help"] for kind in ("persistence", "indexing", "summarizer", "query", "http")
    ):
        podman("run", "--rm", "--network", "none", "--read-only", tag, *command, quiet=True)
    size = size_mb(tag)
    say(f"{tag}: uid 10001, no compiler ({', '.join(COMPILERS)} absent), {size:.0f} MB; every command answers --help")
    return {"image": tag, "size_mb": round(size), "uid": 10001}


def memq_tags() -> list[str]:
    out = podman("images", "--format", "{{.Repository}}:{{.Tag}}", quiet=True).stdout.split()
    return [t for t in out if t.startswith(MEMQ + ":")]
