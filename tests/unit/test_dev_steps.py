"""infra/dev.sh's install steps: run side by side (infra/scripts/steps.sh), every
failure shown and failing the run; and the llama-cpp-python build flags that
the tests' rebuild hint repeats.

The steps here are small shell functions, so these tests need no network."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "infra/scripts/steps.sh"


def run_steps(functions: str, *steps: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    script = f"set -euo pipefail\n. {shlex.quote(str(STEPS))}\n{functions}\nrun_steps {' '.join(steps)}\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout)


def test_steps_run_side_by_side(tmp_path):
    # Each step waits for the other's mark: run one after the other, the first
    # would give up waiting and fail.
    functions = f"""
meet() {{ touch {tmp_path}/$1; for _ in $(seq 100); do [[ -e {tmp_path}/$2 ]] && return 0; sleep 0.1; done; return 1; }}
left() {{ meet left right; echo met; }}
right() {{ meet right left; echo met; }}
"""
    result = run_steps(functions, "left", "right")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "left: met" in lines and "right: met" in lines
    assert any(re.fullmatch(r"left: done in \d+ s", line) for line in lines)


def test_a_failed_step_fails_the_run_and_the_others_still_finish():
    functions = """
broken() { echo "no such package" >&2; return 3; }
slow() { sleep 1; echo finished; }
"""
    result = run_steps(functions, "broken", "slow")
    assert result.returncode != 0
    assert "broken: no such package" in result.stdout  # its stderr, prefixed like the rest
    assert "slow: finished" in result.stdout
    assert "broken: FAILED (exit status 3)" in result.stderr
    assert "failed: broken" in result.stderr
    assert "slow: FAILED" not in result.stderr


def test_a_step_stops_at_its_first_failing_command():
    # errexit holds inside a step (it would not in an `if` condition): a failed
    # pip install must not go on to write the "installed" stamp.
    functions = """
setup() { false; echo "stamp written"; }
"""
    result = run_steps(functions, "setup")
    assert result.returncode != 0
    assert "stamp written" not in result.stdout
    assert "setup: FAILED (exit status 1)" in result.stderr


def test_dev_sh_without_a_command_lists_them_all():
    result = subprocess.run(["bash", str(ROOT / "infra/dev.sh")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    listed = re.findall(r"infra/dev\.sh ([\w-]+)", result.stderr)
    handled = re.findall(r"^  ([\w-]+)\)", (ROOT / "infra/dev.sh").read_text(), re.MULTILINE)
    assert sorted(listed) == sorted(handled)


def test_the_rebuild_hint_uses_the_build_flags_of_dev_sh():
    # tests/services.py tells how to rebuild llama-cpp-python when the server
    # crashes; it must name the flags infra/dev.sh builds with.
    from services import LLAMA_PORTABLE_BUILD

    dev_sh = re.search(r'CMAKE_ARGS:-"([^"]+)"', (ROOT / "infra/dev.sh").read_text())
    hint = re.search(r'CMAKE_ARGS="([^"]+)"', LLAMA_PORTABLE_BUILD)
    assert dev_sh and hint
    assert hint.group(1) == dev_sh.group(1)
