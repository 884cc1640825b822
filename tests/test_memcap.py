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
