"""What the benchmarks' smoke tests (tests/bench_smoke/test_bench_*.py) share:
the command that runs a benchmark as the docs show it, one run that must exit 0
and write its JSON, and a LoCoMo-shaped file small enough for a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).resolve().parent / "run_bench.py"


def bench_command(name: str) -> list[str]:
    """``.venv/bin/python tests/run_bench.py NAME``, with this test's Python."""
    return [sys.executable, str(RUNNER), name]


def run_bench_output(name: str, *args: str, timeout: float = 200) -> str:
    """Run the benchmark; fail with its output's tail unless it exits 0, and
    return what it printed (stdout and the status lines of stderr)."""
    done = subprocess.run([*bench_command(name), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def run_bench(name: str, *args: str, out: Path, timeout: float = 200) -> dict[str, Any]:
    """Run the benchmark with ``--json OUT`` and return what it wrote."""
    run_bench_output(name, *args, "--json", str(out), timeout=timeout)
    return json.loads(out.read_text())


TOPICS = [
    ("pottery", "I made a blue bowl with a dog face at the pottery class"),
    ("camping", "We went camping in the mountains and watched the Perseids"),
    ("painting", "I painted a lake sunrise and hung it in the hallway"),
    ("adoption", "We are adopting a rescue dog called Biscuit from the shelter"),
    ("marathon", "I ran the charity marathon in four hours and twelve minutes"),
    ("guitar", "I started guitar lessons and can play three chords now"),
]


def tiny_locomo(path: Path, conversations: int = 1, sessions: int = 2) -> Path:
    """A LoCoMo-shaped file (bench/locomo.py reads it) of a few short
    conversations, each question's evidence one turn about its topic: the real
    file lives outside the repository and CI has no copy."""
    items = []
    for c in range(conversations):
        conv: dict[str, Any] = {"speaker_a": "Ann", "speaker_b": "Bob"}
        qa = []
        for s in range(1, sessions + 1):
            conv[f"session_{s}_date_time"] = f"1:56 pm on {s} May, 2023"
            turns = []
            for i, (topic, text) in enumerate(TOPICS):
                dia = f"D{s}:{2 * i + 1}"
                turns.append({"speaker": "Ann", "dia_id": dia, "text": f"{text} (session {s}, talk {c})."})
                turns.append({"speaker": "Bob", "dia_id": f"D{s}:{2 * i + 2}", "text": f"That sounds lovely, Ann! {i}"})
                qa.append(
                    {
                        "question": f"What did Ann say about {topic} in session {s}?",
                        "category": 1 + i % 4,
                        "evidence": [dia],
                    }
                )
            conv[f"session_{s}"] = turns
        items.append({"sample_id": f"tiny-{c}", "conversation": conv, "qa": qa})
    path.write_text(json.dumps(items))
    return path
