"""`memq up`, `memq demo`, `memq config` and `memq init` as a user runs them."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import event_counts, wait_for
from services import free_port
from sqlalchemy import func, select

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.sql.engine import create_engine
from memq.workers.sql.models import EVENTS

MEMQ = str(Path(sys.prefix) / "bin" / "memq")


def memq_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    # the HTTP gateway of `memq up` on any free port: test runs side by side do not collide
    env.update({"MEMQ_DATA_DIR": str(data_dir), "MEMQ_LOG_LEVEL": "WARNING", "MEMQ_HTTP__PORT": "0", **extra})
    return env


class MemqUp:
    """`memq up` as a child process, on a free port, in its own data dir."""

    def __init__(self, data_dir: Path, nats_port: int = 0, **env: str):
        self.data_dir = data_dir
        self.nats_port = nats_port  # 0: any free port (a restart then moves: clients cannot follow)
        self.env = env
        self.url_file = data_dir / "run" / "nats.url"
        self.log = data_dir / "up.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        before = self.log.stat().st_size if self.log.exists() else 0  # a restart appends
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [MEMQ, "up", "--nats-port", str(self.nats_port)],
                env=memq_env(self.data_dir, MEMQ_LOG_LEVEL="INFO", **self.env),
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while b"memq ready:" not in self.log.read_bytes()[before:]:  # every worker has started
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
    url = memq_up.start()
    log = memq_up.log.read_text()
    ready = log.index("memq ready:")
    http_url = (memq_up.data_dir / "run" / "http.url").read_text().strip()
    assert http_url.startswith("http://127.0.0.1:")
    assert (
        f"memq ready: NATS {url}, HTTP {http_url}, data {memq_up.data_dir} (new), "
        "workers persistence, indexing, summarizer, query, http"
    ) in log
    assert "memq demo" not in log[:ready]  # not suggested before the workers run
    assert log.index("starting the query worker") < log.index("query worker started") < ready
    assert log.index("indexing worker started") < ready  # its index prepared in the background: search answers
    # The demo as the ready line says to run it: memq is not on this PATH, so
    # the line names the program it was started as.
    suggested = re.search(r"try `(.+?) demo`", log[ready:])
    assert suggested and suggested.group(1) in (MEMQ, os.path.relpath(MEMQ)), log[ready:]
    demo = subprocess.run(
        [*shlex.split(suggested.group(1)), "demo", "--events", "1000"],
        env=memq_env(memq_up.data_dir),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "OK: published 1000, stored 1000, duplicates 0, missing 0" in demo.stdout
    # nats-py calls the disconnected callback on the demo's own close(): no loss to report
    assert "lost the NATS connection" not in demo.stdout + demo.stderr, demo.stdout
    # It says where it wrote and how to look; the commands work as printed.
    steps = demo.stdout.split("look at it with:", 1)[1]
    commands = [shlex.split(line) for line in steps.splitlines() if line.startswith("  ")]
    assert [c[1] for c in commands] == ["sessions", "history", "context"], demo.stdout
    # As printed: `memq` only if that is on PATH, else the program it was run as.
    show = subprocess.run(commands[0], env=memq_env(memq_up.data_dir), capture_output=True, text=True, timeout=60)
    assert show.returncode == 0 and "demo-user" in show.stdout, show.stdout + show.stderr
    assert memq_up.interrupt() == 0, memq_up.log.read_text()
    assert not memq_up.url_file.exists()  # embedded NATS stopped with it
    assert "memq stopped" in memq_up.log.read_text()


async def test_demo_rides_out_a_crash_and_restart_of_up_under_it(tmp_path):
    """Before: `max_reconnect_attempts: 1` gave up on the first lost
    connection, and the PublishOutcomeUnknown that followed ended the demo in
    a 150-line traceback; a long run said nothing for 14 s. Now the demo
    says it lost NATS and got it back, shows progress in a pipe, and checks
    every event stored once and in order."""
    import nats

    n = 30_000
    up = MemqUp(tmp_path / "memq-data", nats_port=free_port())
    try:
        url = up.start()
        out = tmp_path / "demo.out"
        with open(out, "w") as sink:
            demo = subprocess.Popen(
                [MEMQ, "demo", "--events", str(n)], env=memq_env(up.data_dir), stdout=sink, stderr=subprocess.STDOUT
            )
        nc = await nats.connect(url)
        try:

            async def publishing() -> bool:
                assert demo.poll() is None, out.read_text()
                return (await nc.jetstream().stream_info("MEMQ_EVENTS")).state.messages >= 2_000

            await wait_for(publishing, timeout=120, what="the demo under way")
        finally:
            await nc.close()
        up.kill()  # kill -9: its nats-server dies with it
        up.start()  # same port and data dir
        assert demo.wait(timeout=600) == 0, out.read_text()
    finally:
        up.kill()
        if demo.poll() is None:
            demo.kill()
    said = out.read_text()
    assert "lost the NATS connection: reconnecting" in said and "reconnected to NATS" in said, said
    assert f"OK: published {n}, stored {n}, duplicates 0, missing 0, in order: True" in said, said
    assert "Traceback" not in said
    progress = [line for line in said.splitlines() if re.match(rf"published \d+/{n}, stored in SQL \d+/{n}$", line)]
    assert progress, said  # a line every 2 s in a pipe: the run takes longer than that
    engine = create_engine(f"sqlite+aiosqlite:///{up.data_dir / 'memq.db'}")
    try:
        rows, distinct = await event_counts(engine)
        assert rows == distinct == n
        async with engine.connect() as conn:
            with_temp = select(func.count()).select_from(EVENTS).where(EVENTS.c.data.like("%temp:%"))
            assert (
                (await conn.execute(with_temp)).scalar_one() == 0
            )  # the demo's "temp:scratch" is never stored  # the demo's "temp:scratch" is never stored
    finally:
        await engine.dispose()


async def test_ctrl_c_mid_ingest_loses_nothing(memq_up):
    url = memq_up.start()
    events = [Event(message=Message(role="user", parts=[TextPart(text=f"e{i}")])) for i in range(5000)]
    async with await MemoryClient.connect(url, app="cli") as client:
        await client.append_many("u", "s", events)
    t0 = time.monotonic()
    assert memq_up.interrupt() == 0, memq_up.log.read_text()
    took = time.monotonic() - t0
    assert took <= 10, f"Ctrl-C took {took:.1f}s\n{memq_up.log.read_text()}"  # however busy the workers are
    engine = create_engine(f"sqlite+aiosqlite:///{memq_up.data_dir / 'memq.db'}")
    try:
        stored_at_stop = (await event_counts(engine))[0]
        before = memq_up.log.read_text()
        memq_up.start()  # the rest waited in the stream
        # The data dir is not new, and the ready line says what it holds.
        ready = next(line for line in memq_up.log.read_text()[len(before) :].splitlines() if "memq ready:" in line)
        said = re.search(rf"data {re.escape(str(memq_up.data_dir))} \(existing: (\d+) events since \d{{4}}-", ready)
        assert said and int(said.group(1)) >= len(events), ready  # the log's messages: the appends, and the session's

        async def all_stored() -> bool:
            rows, distinct = await event_counts(engine)
            assert rows == distinct
            return rows == len(events)

        await wait_for(all_stored, timeout=120, what="every event after restart")
    finally:
        await engine.dispose()
    assert stored_at_stop <= len(events)


def test_beside_up_config_shows_the_urls_in_use_and_deleting_a_missing_session_fails(memq_up):
    url = memq_up.start()
    env = memq_env(memq_up.data_dir)
    # `memq status` lists the HTTP gateway, and reads at 80 columns in a pipe
    # (captured output is a pipe): no line wider, no name wrapped.
    status = subprocess.run([MEMQ, "status"], env={**env, "COLUMNS": "80"}, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert max(len(line.rstrip()) for line in status.stdout.splitlines()) <= 80, status.stdout
    http_url = (memq_up.data_dir / "run" / "http.url").read_text().strip()
    rows = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
    for service in ("persistence", "indexing", "summarizer", "query", "http"):
        assert service in rows, status.stdout
    assert http_url in rows["http"], status.stdout
    assert "memq-persistence" in rows and "memq-indexing" in rows  # the consumers, unwrapped
    shown = json.loads(subprocess.run([MEMQ, "config"], env=env, capture_output=True, text=True, timeout=60).stdout)
    assert shown["nats"]["url"] == url
    assert shown["database"]["url"] == f"sqlite+aiosqlite:///{memq_up.data_dir / 'memq.db'}"
    delete = subprocess.run(
        [MEMQ, "sessions", "delete", "no-such-session", "--user", "nobody", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert delete.returncode == 1, delete.stdout + delete.stderr
    assert delete.stderr.strip() == (
        "no such session 'no-such-session' of user 'nobody' in app 'memq-demo': "
        "nothing deleted (see `memq sessions list`)"
    )
    assert "delete published" not in delete.stdout


async def test_inmemory_database_under_up_round_trips(tmp_path):
    """Every worker of `memq up` sees the one in-memory database (before: each
    had its own, and a session just written was not found)."""
    up = MemqUp(tmp_path / "memq-data", MEMQ_DATABASE__URL="inmemory")
    try:
        url = up.start()
        async with await MemoryClient.connect(url, app="cli") as client:
            await client.create_session("u", "s", state={"topic": "memory"})
            await client.append_text("u", "s", "user", "remember me")
            history = await client.history("u", "s")  # read-your-writes through the query worker
            session = await client.get_session("u", "s")
        assert [e.event["message"]["parts"][0]["text"] for e in history.events] == ["remember me"]
        assert session.state["topic"] == "memory"
    finally:
        up.kill()


def test_a_lone_worker_refuses_the_inmemory_database(tmp_path):
    out = subprocess.run(
        [MEMQ, "worker", "persistence"],
        env=memq_env(tmp_path, MEMQ_DATABASE__URL="inmemory"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "memq up" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "command", [["demo"], ["init"], ["status"], ["sessions", "list"], ["worker", "query"]], ids=" ".join
)
def test_a_dead_nats_fails_within_seconds_with_one_line(tmp_path, command):
    """Before: `memq demo` waited 188 s, printing 61 tracebacks, then crashed."""
    url = f"nats://127.0.0.1:{free_port()}"  # nobody listens there
    started = time.monotonic()
    out = subprocess.run(
        [MEMQ, *command], env=memq_env(tmp_path, MEMQ_NATS__URL=url), capture_output=True, text=True, timeout=300
    )
    elapsed = time.monotonic() - started
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if not line.startswith("starting the ")]  # a worker's progress
    assert len(errors) == 1 and errors[0].startswith(f"cannot reach NATS at {url} ("), out.stderr
    assert "is `memq up` running, or MEMQ_NATS__URL right?" in errors[0]
    assert elapsed < 10, f"{elapsed:.1f}s"


def test_a_url_file_left_by_a_crash_is_reported_as_stale(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "nats.url").write_text(f"nats://127.0.0.1:{free_port()}")
    proc = subprocess.Popen(["true"])
    proc.wait()
    (run / "nats.pid").write_text(str(proc.pid))  # memq up was killed: its server is gone
    demo = subprocess.run([MEMQ, "demo"], env=memq_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert demo.returncode == 1 and "Traceback" not in demo.stderr
    assert "memq up is not running (stale file from a crashed run" in demo.stderr
    shown = json.loads(subprocess.run([MEMQ, "config"], env=memq_env(tmp_path), capture_output=True, text=True).stdout)
    assert "stale file from a crashed run" in shown["nats"]["url"]


def test_config_without_a_stack_says_nats_is_not_running(tmp_path):
    shown = json.loads(subprocess.run([MEMQ, "config"], env=memq_env(tmp_path), capture_output=True, text=True).stdout)
    assert shown["nats"]["url"].startswith("not running")
    assert shown["database"]["url"] == f"sqlite+aiosqlite:///{tmp_path / 'memq.db'}"


def test_demo_without_a_running_stack_says_what_to_do(tmp_path):
    demo = subprocess.run([MEMQ, "demo"], env=memq_env(tmp_path), capture_output=True, text=True, timeout=60)
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

    from memq.workers.sql.engine import MIGRATIONS_DIR

    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def run_memq(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([MEMQ, *args], env=env, capture_output=True, text=True, timeout=timeout)


def assert_fails_up_front(out: subprocess.CompletedProcess, data_dir: Path, *expected: str) -> None:
    """One line on stderr, saying ``expected``; exit 1 or 2; nothing started."""
    assert out.returncode in (1, 2), out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for text in expected:
        assert text in lines[0], out.stderr
    assert not (data_dir / "nats.log").exists()  # nats-server never started
    assert "starting" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        # an option names itself (before: the variable it stands for)
        (["--nats-port", "99999"], {}, "nats.port (--nats-port): Input should be less than or equal to 65535"),
        (["--nats-port", "-1"], {}, "nats.port (--nats-port): Input should be greater than or equal to 0"),
        (["--http-port", "70000"], {}, "http.port (--http-port): Input should be less than or equal to 65535"),
        ([], {"MEMQ_NATS__PORT": "99999"}, "nats.port (MEMQ_NATS__PORT)"),
    ],
    ids=["nats-port-high", "nats-port-negative", "http-port-high", "env-nats-port"],
)
def test_up_refuses_a_port_out_of_range_in_one_line(tmp_path, args, env, expected):
    """Before: a 40-line traceback ending in OverflowError, after NATS had started."""
    out = run_memq("up", *args, env=memq_env(tmp_path, **env))
    assert_fails_up_front(out, tmp_path, "invalid settings:", expected)


@pytest.mark.parametrize("which", ["http", "nats"])
def test_up_with_a_taken_port_stops_before_anything_starts(tmp_path, which):
    """Before: a taken HTTP port started NATS and four workers, then ended in a
    223-line traceback 7 s later."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        started = time.monotonic()
        out = run_memq(
            "up",
            "--nats-port",
            port if which == "nats" else "0",
            env=memq_env(tmp_path, MEMQ_HTTP__PORT=port if which == "http" else "0"),
        )
        elapsed = time.monotonic() - started
    option = f"--{which}-port or MEMQ_{which.upper()}__PORT"
    assert_fails_up_front(out, tmp_path, f"127.0.0.1:{port}", option)
    assert elapsed < 30, f"{elapsed:.1f}s"  # no worker waited for (a loaded machine: not a timing test)


def test_up_with_an_unusable_data_dir_stops_in_one_line(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    out = run_memq("up", "--nats-port", "0", env=memq_env(a_file / "memq"))
    assert_fails_up_front(out, tmp_path, f"the data dir {a_file / 'memq'} is not usable", "MEMQ_DATA_DIR")


def test_up_without_a_package_it_needs_stops_in_one_line(tmp_path):
    """An extra not installed (here uvicorn, which the HTTP gateway needs,
    hidden from the process) is found before anything starts."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'uvicorn':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    env = memq_env(tmp_path / "data")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hide), env.get("PYTHONPATH")]))
    out = run_memq("up", "--nats-port", "0", env=env)
    assert_fails_up_front(out, tmp_path / "data", "uvicorn is not installed", "the HTTP gateway", "memq[workers]")


@pytest.mark.parametrize(
    ("variable", "closest"),
    [("MEMQ_NATS_URL", "MEMQ_NATS__URL"), ("MEMQ_PERSISTENCE__BATCHSIZE", "MEMQ_PERSISTENCE__BATCH_SIZE")],
)
def test_a_misspelled_setting_is_warned_about_with_the_closest_name(tmp_path, variable, closest):
    """Before: pydantic-settings ignored it, and nothing was said."""
    out = run_memq("config", env=memq_env(tmp_path, **{variable: "nats://127.0.0.1:1"}))
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == f"warning: {variable} is not a memq setting, ignored; did you mean {closest}?"


def test_the_embedded_nats_port_is_a_setting(tmp_path):
    """MEMQ_NATS__PORT (before: ignored in silence) sets the port `memq up` uses."""
    shown = json.loads(run_memq("config", env=memq_env(tmp_path, MEMQ_NATS__PORT="4333")).stdout)
    assert shown["nats"]["port"] == 4333
