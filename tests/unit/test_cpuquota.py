"""tests/bench/cpuquota.py: which cgroup layout it finds, what it writes and
reads (a fake hierarchy), and, where this machine lets it, that a busy loop
in a quota'd cgroup gets its quota and no more, and that every cgroup made is
gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from bench import cpuquota
from bench.fleet import sample


def fake(tmp_path, version: str):
    if version == "v2":
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        return tmp_path
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    return tmp_path


def test_it_finds_v2_then_v1_and_says_when_there_is_neither(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert cpuquota.find_hierarchy(fake(tmp_path / "a", "v2")) == ("v2", tmp_path / "a")
    assert cpuquota.find_hierarchy(fake(tmp_path / "b", "v1")) == ("v1", tmp_path / "b" / "cpu")
    hybrid = tmp_path / "c"  # a unified tree without the cpu controller, and v1's cpu beside it
    hybrid.mkdir()
    (hybrid / "cgroup.controllers").write_text("hugetlb\n")
    (hybrid / "cpu").mkdir()
    (hybrid / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpuquota.find_hierarchy(hybrid) == ("v1", hybrid / "cpu")
    with pytest.raises(cpuquota.Unavailable, match="no cgroup hierarchy with the cpu controller"):
        cpuquota.find_hierarchy(tmp_path)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_it_writes_the_quota_and_the_pid_and_reads_the_throttling(tmp_path, version):
    quotas = cpuquota.Quotas("run", root=fake(tmp_path, version))
    path = quotas.confine("indexing-0", 4242, 0.25)
    assert (path / "cgroup.procs").read_text() == "4242"
    if version == "v2":
        assert (quotas.parent / "cgroup.subtree_control").read_text() == "+cpu"
        assert (path / "cpu.max").read_text() == "25000 100000"
        (path / "cpu.stat").write_text("usage_usec 9\nnr_periods 40\nnr_throttled 10\nthrottled_usec 1500000\n")
    else:
        assert (path / "cpu.cfs_quota_us").read_text() == "25000"
        assert (path / "cpu.cfs_period_us").read_text() == "100000"
        (path / "cpu.stat").write_text("nr_periods 40\nnr_throttled 10\nthrottled_time 1500000000\n")
    assert quotas.limit("indexing-0") == 0.25
    quotas.confine("indexing-1", 4243, 0.25)
    weight = {"v1": ("cpu.shares", "2048"), "v2": ("cpu.weight", "200")}[version]
    assert (quotas.parent / weight[0]).read_text() == weight[1]  # two replicas weigh as two processes did
    before = cpuquota.Throttling(periods=20, throttled=2, throttled_s=0.5)
    assert quotas.throttling("indexing-0").since(before) == cpuquota.Throttling(20, 8, 1.0)


def real_quotas() -> cpuquota.Quotas:
    try:
        return cpuquota.Quotas(f"memq-test-cpuquota-{os.getpid()}")
    except cpuquota.Unavailable as exc:
        pytest.skip(f"no writable cgroup cpu controller here: {exc}")


def test_a_busy_loop_gets_its_quota_and_every_cgroup_is_removed():
    quotas = real_quotas()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        quotas.confine("spinner", spinner.pid, 0.2)
        start, t0 = sample(spinner.pid).cpu_s, time.perf_counter()
        time.sleep(2.0)
        used = (sample(spinner.pid).cpu_s - start) / (time.perf_counter() - t0)
        throttling = quotas.throttling("spinner")
    finally:
        spinner.kill()
        spinner.wait()
        left = quotas.close()
    assert used <= 0.2 * 1.25 + 0.02, f"a busy loop held to 0.2 core used {used:.2f}"  # unlimited it takes ~1
    assert throttling.throttled > 0 and throttling.throttled_s > 0
    assert left == [] and not quotas.parent.exists()


def test_close_takes_back_a_process_still_running():
    quotas = real_quotas()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        path = quotas.confine("sleeper", sleeper.pid, 0.5)
        assert str(sleeper.pid) in (path / "cgroup.procs").read_text().split()
        assert quotas.close() == [] and not path.exists() and not quotas.parent.exists()
        assert sleeper.poll() is None  # moved out, not killed
    finally:
        sleeper.kill()
        sleeper.wait()
