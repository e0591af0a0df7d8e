"""The resident memory of `memq up` (default embedded settings): after every
worker has started, and again after one search (which loads what the query
worker's search needs). Run: python infra/scripts/up_rss.py"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        env.update(MEMQ_DATA_DIR=str(data), MEMQ_LOG_LEVEL="INFO", MEMQ_HTTP__PORT="0")
        log = data / "up.log"
        memq = str(Path(sys.prefix) / "bin" / "memq")
        with open(log, "wb") as out:
            proc = subprocess.Popen([memq, "up", "--nats-port", "0"], env=env, stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 180
            while b"memq ready:" not in log.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(log.read_text())
                time.sleep(0.2)
            time.sleep(3)  # the indexing worker prepares its index in the background
            started = rss_mib(proc.pid)
            url = (data / "run" / "http.url").read_text().strip()
            with urllib.request.urlopen(f"{url}/v1/apps/default/users/u/search?q=hello", timeout=120) as reply:
                reply.read()
            time.sleep(1)
            searched = rss_mib(proc.pid)
            print(f"memq up RSS: {started:.0f} MiB after start, {searched:.0f} MiB after one search")
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
