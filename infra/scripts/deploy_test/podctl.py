"""Podman and podman-compose, as the deploy test drives them: every call
printed, its failure one line (with the command's last output), and every
name the test makes under one prefix so that cleaning up touches nothing else.

Podman 4.3 (Debian 12) runs here with runc and cgroupfs (crun refuses the
default ulimits on these VMs: /work/shared/CONTAINERS.md), and without
systemd, so healthchecks never run by themselves: :func:`healthy` runs them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PREFIX = "memq-deploy-test"
PROJECT = PREFIX  # podman-compose -p: containers memq-deploy-test_<service>_<n>
CACHE = Path(os.environ.get("MEMQ_DEPLOY_TEST_CACHE", Path.home() / ".cache" / "memq-deploy-test"))
PODMAN_COMPOSE_VERSION = "1.6.0"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
_T0 = time.monotonic()


class Failed(RuntimeError):
    """A step of the deploy test failed (the message says which and why)."""


def say(message: str) -> None:
    print(f"[deploy-test {time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def run(
    args: list[str],
    *,
    check: bool = True,
    quiet: bool = False,
    timeout: float = 1800,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; its output comes back (and, unless quiet, its line is printed)."""
    if not quiet:
        say("$ " + shlex.join(args))
    try:
        result = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
            input=input,
        )
    except subprocess.TimeoutExpired:
        raise Failed(f"{shlex.join(args)}: no answer in {timeout:.0f} s") from None
    if check and result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
        raise Failed(f"{shlex.join(args)} exited {result.returncode}:\n    " + "\n    ".join(tail))
    return result


def podman(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run([*PODMAN, *args], **kw)


def compose_bin() -> str:
    return str(CACHE / "venv" / "bin" / "podman-compose")


def compose(files: list[Path], *args: str, env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """podman-compose on the project PREFIX (its containers, network and volumes
    carry the name); no pod (it would be named pod_<project>, and the
    containers need no shared namespace)."""
    named = [a for f in files for a in ("-f", str(f))]
    return run([compose_bin(), "--in-pod", "false", "-p", PROJECT, *named, *args], env=env, **kw)


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False, quiet=True).returncode == 0


def inspect(name: str) -> dict[str, Any]:
    return json.loads(podman("inspect", name, quiet=True).stdout)[0]


def containers(prefix: str = PREFIX) -> list[str]:
    """Names of every container (running or not) whose name starts with prefix."""
    out = podman("ps", "-a", "--format", "{{.Names}}", quiet=True).stdout.split()
    return sorted(n for n in out if n.startswith(prefix))


def state(name: str) -> str:
    return podman("inspect", "--format", "{{.State.Status}}", name, check=False, quiet=True).stdout.strip()


def healthcheck(name: str) -> list[str]:
    """The container's healthcheck command (["CMD", ...] or ["CMD-SHELL", "..."]), [] if none."""
    check = json.loads(podman("inspect", "--format", "{{json .Config.Healthcheck}}", name, quiet=True).stdout or "null")
    return list((check or {}).get("Test") or [])


def healthy(name: str, timeout: float = 180, test: list[str] | None = None) -> None:
    """Run the container's healthcheck until it passes (no systemd here runs it
    by itself); `test`: run this healthcheck command in it instead (a clone
    made by `podman container clone` 4.3 has lost its own)."""
    deadline = time.monotonic() + timeout
    if test:
        exec_args = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
    while True:
        if state(name) == "exited":
            logs = podman("logs", "--tail", "20", name, check=False, quiet=True)
            raise Failed(f"{name} exited before it was healthy:\n{logs.stdout}{logs.stderr}")
        args = ["exec", name, *exec_args] if test else ["healthcheck", "run", name]
        if podman(*args, check=False, quiet=True).returncode == 0:
            return
        if time.monotonic() > deadline:
            logs = podman("logs", "--tail", "20", name, check=False, quiet=True)
            raise Failed(f"{name} not healthy in {timeout:.0f} s:\n{logs.stdout}{logs.stderr}")
        time.sleep(2)


def wait_exit(name: str, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while state(name) not in ("exited", "stopped", ""):
        if time.monotonic() > deadline:
            raise Failed(f"{name} still running after {timeout:.0f} s")
        time.sleep(1)
    return int(podman("inspect", "--format", "{{.State.ExitCode}}", name, quiet=True).stdout.strip())


def logs_tail(name: str, lines: int = 30) -> str:
    result = podman("logs", "--tail", str(lines), name, check=False, quiet=True)
    return result.stdout + result.stderr


def stderr_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
