"""Which packages an extra makes pip install older than memq alone would.

For each extra, pip resolves ``memq[workers,<extra>]`` and ``memq[workers]``
in a throwaway virtualenv (``pip install --dry-run --report``: nothing is
installed, the index is asked) and this prints every package the extra
moves to an older version, with the upstream cap that forces it. A
downgrade that pyproject.toml does not explain (``KNOWN``, below, mirrors
its comments) fails the run: a new one needs a widened pin or a reason.

    .venv/bin/python infra/scripts/extras_downgrades.py [EXTRA ...]   (default: every adapter extra)

Needs the package index (network); minutes per extra.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
BASE = "workers"
EXTRAS = ["adk", "langchain", "mcp", "langgraph", "openai-agents"]
# (extra, package): why it comes older. Neither cap is memq's: no pin of ours can lift it.
KNOWN = {
    ("langchain", "uuid-utils"): "langchain-core needs langsmith<1, which caps uuid-utils<1.0",
    ("langgraph", "uuid-utils"): "langgraph needs langchain-core: langsmith caps uuid-utils<1.0",
    ("adk", "opentelemetry-api"): "google-adk 2.13.0, the newest, caps opentelemetry-api<=1.44",
}


def resolve(pip: Path, extras: str) -> dict[str, Version]:
    """The versions pip would install for memq[extras], from scratch."""
    report = subprocess.run(
        [str(pip), "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-", f"{ROOT}[{extras}]"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {
        item["metadata"]["name"].lower().replace("_", "-"): Version(item["metadata"]["version"])
        for item in json.loads(report)["install"]
    }


def main(extras: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="memq-extras-") as where:
        venv.create(where, with_pip=True)
        pip = Path(where) / "bin" / "pip"
        base = resolve(pip, BASE)
        unexplained = 0
        for extra in extras:
            got = resolve(pip, f"{BASE},{extra}")
            older = {name: (base[name], v) for name, v in got.items() if name in base and v < base[name]}
            for name, (was, now) in sorted(older.items()):
                why = KNOWN.get((extra, name))
                unexplained += why is None
                print(f"memq[{BASE},{extra}]: {name} {was} -> {now} ({why or 'NOT EXPLAINED in pyproject.toml'})")
            if not older:
                print(f"memq[{BASE},{extra}]: no downgrade")
    return 1 if unexplained else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Packages an extra makes pip install older than memq[workers] alone.")
    parser.add_argument("extras", nargs="*", metavar="EXTRA", help=f"any of: {' '.join(EXTRAS)} (default: all)")
    extras = parser.parse_args().extras or EXTRAS
    if unknown := sorted(set(extras) - set(EXTRAS)):  # argparse's choices refuse an empty nargs="*" on 3.11
        parser.error(f"no adapter extra {', '.join(unknown)} (any of: {' '.join(EXTRAS)})")
    sys.exit(main(extras))
