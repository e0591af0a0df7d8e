"""The embedded nats-server of `memq up` after a crash (issue 11): its port
in TIME-WAIT, a port truly taken, the run files a killed run leaves; and
the threads it runs Go code on (GOMAXPROCS)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from memq.workers.runtime import bus
from memq.workers.runtime.embedded_nats import EmbeddedError, EmbeddedNats, _port_is_free, server_env
from memq.workers.settings import Settings


def time_wait_port() -> int:
    """A port whose only socket is in TIME-WAIT, as after nats-server's exit
    with clients connected: the side that closes first keeps TIME-WAIT."""
    with socket.socket() as listener:
        # As nats-server (Go) listens; Linux lets a port be bound again over
        # TIME-WAIT only when both the old and the new socket have it.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side first
        client.recv(1)  # its FIN has arrived
        client.close()
    return port


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path)


def test_a_port_in_time_wait_is_free_for_nats(settings):
    port = time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):  # what the old probe saw: "taken"
        plain.bind(("127.0.0.1", port))
    assert _port_is_free(port)
    embedded = EmbeddedNats(settings, port=port)
    try:
        assert embedded.start() == f"nats://127.0.0.1:{port}"  # not moved to another port
    finally:
        embedded.stop()


def test_a_taken_port_is_an_error_not_silently_replaced(settings):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(EmbeddedError, match=f"port {port} is taken.*--nats-port"):
            EmbeddedNats(settings, port=port).start()
    assert not (settings.run_dir / "nats.url").exists()


def test_the_run_files_of_a_crashed_run_are_stale_and_cleaned_up(settings):
    settings.run_dir.mkdir(parents=True)
    (settings.run_dir / "nats.url").write_text("nats://127.0.0.1:4222")
    (settings.run_dir / "nats.pid").write_text(str(dead_pid()))
    with pytest.raises(bus.NatsNotFound, match=r"memq up is not running \(stale file from a crashed run"):
        bus.nats_url(settings)
    embedded = EmbeddedNats(settings, port=0)
    try:
        url = embedded.start()
        assert embedded.stale_files_removed
        assert bus.nats_url(settings) == url
    finally:
        embedded.stop()


def test_the_server_runs_on_half_the_cores_unless_told(monkeypatch):
    assert server_env(0, {}, cores=2)["GOMAXPROCS"] == "1"
    assert server_env(0, {}, cores=16)["GOMAXPROCS"] == "8"
    assert server_env(0, {}, cores=1)["GOMAXPROCS"] == "1"
    assert server_env(0, {"GOMAXPROCS": "3", "PATH": "/bin"}, cores=16) == {"GOMAXPROCS": "3", "PATH": "/bin"}
    assert server_env(4, {"GOMAXPROCS": "3"}, cores=2)["GOMAXPROCS"] == "4"  # the setting wins


def test_memq_up_starts_nats_server_with_its_threads_set(tmp_path, monkeypatch):
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    monkeypatch.setenv("MEMQ_NATS__EMBEDDED_THREADS", "3")
    embedded = EmbeddedNats(Settings(data_dir=tmp_path), port=0)
    embedded.start()
    try:
        environ = (Path("/proc") / str(embedded.process.pid) / "environ").read_bytes().split(b"\0")
        assert b"GOMAXPROCS=3" in environ
    finally:
        embedded.stop()
