"""services.free_port hands a port out once per machine, not once per process:
pytest-xdist workers and the benchmarks they start each pick ports, and a port
handed out but not bound yet looks free to the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import services

TESTS = Path(__file__).resolve().parents[1]  # where services.py is


def test_a_port_claimed_here_is_refused_to_another_process(tmp_path, monkeypatch):
    monkeypatch.setattr(services, "PORT_CLAIMS", tmp_path)
    port = services.free_port()
    probe = (
        "import sys, services; from pathlib import Path;"
        f"services.PORT_CLAIMS = Path({str(tmp_path)!r});"
        f"print(services._claim({port}), services._claim({port + 100000}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=TESTS)
    assert out.stdout.split() == ["False", "True"]


def test_a_stale_claim_frees_its_port(tmp_path, monkeypatch):
    monkeypatch.setattr(services, "PORT_CLAIMS", tmp_path)
    assert services._claim(40001)
    assert not services._claim(40001)
    os.utime(tmp_path / "40001", (0, 0))  # claimed at the epoch: long past the TTL
    assert services._claim(40001)


def test_ports_handed_out_by_two_processes_never_meet(tmp_path, monkeypatch):
    monkeypatch.setattr(services, "PORT_CLAIMS", tmp_path)
    probe = (
        "import services; from pathlib import Path;"
        f"services.PORT_CLAIMS = Path({str(tmp_path)!r});"
        "print(*[services.free_port() for _ in range(200)])"
    )
    other = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True, cwd=TESTS)
    mine = {services.free_port() for _ in range(200)}
    theirs = set(map(int, other.communicate()[0].split()))
    assert len(theirs) == 200 and not mine & theirs
