"""`memq up`, `memq demo`, `memq config` and `memq init` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.client import MemoryClient
from contracts.schemas import Event, Message, TextPart
from helpers import event_counts, wait_for
from workers.sql.engine import create_engine

MEMQ = str(Path(sys.prefix) / "bin" / "memq")


def memq_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update({"MEMQ_DATA_DIR": str(data_dir), "MEMQ_LOG_LEVEL": "WARNING", **extra})
    return env


class MemqUp:
    """`memq up` as a child process, on a free port, in its own data dir."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.url_file = data_dir / "run" / "nats.url"
        self.log = data_dir / "up.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [MEMQ, "up", "--nats-port", "0"],
                env=memq_env(self.data_dir, MEMQ_LOG_LEVEL="INFO"),
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while not (self.url_file.is_file() and b"worker started" in self.log.read_bytes()):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)
        return self.url_file.read_text().strip()

    def interrupt(self) -> int:
        """Ctrl-C, as a user would press it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def memq_up(tmp_path):
    up = MemqUp(tmp_path / "memq-data")
    yield up
    up.kill()


def test_up_then_demo_beside_it_needs_no_flags(memq_up):
    memq_up.start()
    demo = subprocess.run(
        [MEMQ, "demo", "--events", "1000"], env=memq_env(memq_up.data_dir), capture_output=True, text=True, timeout=180
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "OK: published 1000, stored 1000, duplicates 0, missing 0" in demo.stdout
    assert memq_up.interrupt() == 0, memq_up.log.read_text()
    assert not memq_up.url_file.exists()  # embedded NATS stopped with it
    assert "memq stopped" in memq_up.log.read_text()


async def test_ctrl_c_mid_ingest_loses_nothing(memq_up):
    url = memq_up.start()
    events = [Event(message=Message(role="user", parts=[TextPart(text=f"e{i}")])) for i in range(5000)]
    async with await MemoryClient.connect(url, app="cli") as client:
        await client.append_many("u", "s", events)
    assert memq_up.interrupt() == 0, memq_up.log.read_text()
    engine = create_engine(f"sqlite+aiosqlite:///{memq_up.data_dir / 'memq.db'}")
    try:
        stored_at_stop = (await event_counts(engine))[0]
        memq_up.start()  # the rest waited in the stream

        async def all_stored() -> bool:
            rows, distinct = await event_counts(engine)
            assert rows == distinct
            return rows == len(events)

        await wait_for(all_stored, timeout=120, what="every event after restart")
    finally:
        await engine.dispose()
    assert stored_at_stop <= len(events)


def test_demo_without_a_running_stack_says_what_to_do(tmp_path):
    demo = subprocess.run(
        [MEMQ, "demo"], env=memq_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert demo.returncode == 1
    assert "memq up" in demo.stderr


def test_config_masks_secrets(tmp_path):
    env = memq_env(
        tmp_path,
        MEMQ_DATABASE__URL="postgresql+asyncpg://memq:s3cr3t-pw@db:5432/memq",
        MEMQ_NATS__PASSWORD="n4ts-pw",
        MEMQ_NATS__URL="nats://agent:inline-pw@nats:4222",
    )
    out = subprocess.run([MEMQ, "config"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for secret in ("s3cr3t-pw", "n4ts-pw", "inline-pw"):
        assert secret not in out.stdout
    shown = json.loads(out.stdout)
    assert shown["database"]["url"] == "postgresql+asyncpg://memq:***@db:5432/memq"
    assert shown["persistence"]["batch_size"] == 256


def test_config_file_is_read_and_environment_wins(tmp_path):
    (tmp_path / "memq.toml").write_text('log_level = "ERROR"\n[persistence]\nbatch_size = 64\nbatch_wait_s = 0.5\n')
    env = memq_env(tmp_path, MEMQ_PERSISTENCE__BATCH_SIZE="32")
    del env["MEMQ_LOG_LEVEL"]
    shown = json.loads(subprocess.run([MEMQ, "config"], env=env, capture_output=True, text=True).stdout)
    assert shown["log_level"] == "ERROR"
    assert shown["persistence"]["batch_size"] == 32
    assert shown["persistence"]["batch_wait_s"] == 0.5


def test_init_is_idempotent(nats_url, tmp_path):
    env = memq_env(tmp_path, MEMQ_NATS__URL=nats_url)
    first = subprocess.run([MEMQ, "init"], env=env, capture_output=True, text=True, timeout=60)
    second = subprocess.run([MEMQ, "init"], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "stream MEMQ_EVENTS: created" in first.stdout
    assert "stream MEMQ_EVENTS: unchanged" in second.stdout
    assert "stream MEMQ_DLQ: unchanged" in second.stdout
    assert f"database: at revision {head_revision()}" in second.stdout


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from workers.sql.engine import MIGRATIONS_DIR

    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
