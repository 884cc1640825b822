"""A memory cgroup for one rank: the kernel's out-of-memory killer ends a process past the limit, and nothing is
left behind (notebook 05 shows a rank killed this way and the runner's message naming it)."""
import subprocess
import sys

import pytest

from course_utils.kernel.launch import memcap

ALLOCATE = """
import sys
open(sys.argv[1], "w").write(str(__import__("os").getpid()))
held = [bytearray(32 * 2**20) for _ in range(64)]       # 2 GiB, touched by bytearray's zero fill
print("not stopped")
"""


def test_a_process_over_its_cap_is_killed_by_the_kernel_and_the_cgroup_goes():
    try:
        with memcap.memory_cap(128) as procs:
            group = procs.parent
            assert group.is_dir()
            run = subprocess.run([sys.executable, "-c", ALLOCATE, str(procs)], capture_output=True, text=True, timeout=60)
    except memcap.MemoryCapUnavailable as e:
        pytest.skip(str(e))
    assert run.returncode == -9 and "not stopped" not in run.stdout
    assert not group.exists()


def test_without_a_cgroup_file_system_it_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(memcap, "CGROUP_ROOT", tmp_path)
    with pytest.raises(memcap.MemoryCapUnavailable, match="no cgroup file system"):
        with memcap.memory_cap(128):
            pass


def _v1_tree(tmp_path, monkeypatch):
    (tmp_path / "memory").mkdir()
    monkeypatch.setattr(memcap, "CGROUP_ROOT", tmp_path)
    return tmp_path / "memory"


def test_a_v1_host_with_swap_and_no_swap_accounting_gets_no_limit_that_swap_would_undo(tmp_path, monkeypatch):
    """Without ``memory.memsw.limit_in_bytes`` a v1 rank past the limit pages to swap instead of being stopped."""
    import shutil

    tree = _v1_tree(tmp_path, monkeypatch)
    monkeypatch.setattr(memcap, "swap_bytes", lambda: 2**30)
    monkeypatch.setattr(memcap.Path, "rmdir", shutil.rmtree)          # a cgroup's folder goes with its control files
    with pytest.raises(memcap.MemoryCapUnavailable, match="swapoff -a"):
        with memcap.memory_cap(128):
            pass
    assert list(tree.iterdir()) == []                  # the cgroup it began is gone


def test_a_v1_host_without_swap_gets_its_limit(tmp_path, monkeypatch):
    tree = _v1_tree(tmp_path, monkeypatch)
    monkeypatch.setattr(memcap, "swap_bytes", lambda: 0)
    monkeypatch.setattr(memcap.Path, "rmdir", lambda self: None)     # a plain folder: the kernel's files are absent
    with memcap.memory_cap(128) as procs:
        assert (procs.parent / "memory.limit_in_bytes").read_text() == str(128 * 2**20)


HOLD = """
import sys, time
from course_utils.kernel.launch import memcap
with memcap.memory_cap(128) as procs:
    print(procs.parent, flush=True)
    time.sleep(120)
"""


def test_a_kernel_killed_while_it_holds_a_cgroup_leaves_none():
    """SIGKILL skips the ``with`` block's removal: the cgroup's watchdog removes it when its maker dies."""
    import os
    import signal
    import time
    from pathlib import Path

    if not memcap.available():
        pytest.skip("no memory cgroups here")
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        group = Path(holder.stdout.readline().strip())
        assert group.is_dir()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 30
    while group.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group.exists(), f"{group} outlived the process that made it"
