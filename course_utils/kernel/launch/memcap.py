"""A memory limit for one rank, from the kernel's own memory cgroup, so that the out-of-memory killer ends it for real.

``with memory_cap(300) as procs:`` makes a memory cgroup of its own (cgroup v2's ``memory.max`` or v1's
``memory.limit_in_bytes``, with no swap beside it: v2's ``memory.swap.max`` 0, v1's ``memory.memsw.limit_in_bytes``
the same limit, or no cgroup at all on a v1 host with swap and no swap accounting) and yields its ``cgroup.procs`` file; a rank that writes its pid there lives under the
limit, and when it allocates past it the kernel kills it with SIGKILL, exactly as on a machine out of memory.
On leaving, the cgroup is removed (once its processes are gone). It needs root and a writable cgroup file system;
elsewhere :class:`MemoryCapUnavailable` says so.
"""
from __future__ import annotations

import itertools
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CGROUP_ROOT = Path("/sys/fs/cgroup")
_count = itertools.count()


class MemoryCapUnavailable(RuntimeError):
    """This machine gives the course no memory cgroup of its own (not root, or a read-only cgroup file system)."""


def _layout() -> tuple[Path, str]:
    """The folder new memory cgroups go in and the name of their limit file."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():          # cgroup v2: one tree
        if "memory" not in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
            raise MemoryCapUnavailable("the cgroup v2 tree has no memory controller")
        return CGROUP_ROOT, "memory.max"
    if (CGROUP_ROOT / "memory").is_dir():                       # cgroup v1: a tree per controller
        return CGROUP_ROOT / "memory", "memory.limit_in_bytes"
    raise MemoryCapUnavailable(f"no cgroup file system at {CGROUP_ROOT}")


def swap_bytes() -> int:
    """The machine's swap space (``SwapTotal`` of ``/proc/meminfo``), 0 without one."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("SwapTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextmanager
def memory_cap(megabytes: int, wait: float = 10.0) -> Iterator[Path]:
    """A fresh memory cgroup limited to ``megabytes``; yields its ``cgroup.procs`` file. Removed on exit."""
    parent, limit_file = _layout()
    group = parent / f"deepspeed-course-{os.getpid()}-{next(_count)}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(megabytes * 2**20))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")       # no swap to hide in: the limit is the limit
        elif (group / "memory.memsw.limit_in_bytes").exists():  # v1: memory and swap together, the same limit
            (group / "memory.memsw.limit_in_bytes").write_text(str(megabytes * 2**20))
        elif limit_file == "memory.limit_in_bytes" and swap_bytes() > 0:
            group.rmdir()
            raise MemoryCapUnavailable("this cgroup v1 host has swap but no swap accounting (no "
                                       "memory.memsw.limit_in_bytes): a rank past the limit would page to swap instead "
                                       "of being stopped. Turn swap off (swapoff -a) or boot with swapaccount=1")
    except OSError as e:
        if group.exists():
            group.rmdir()
        raise MemoryCapUnavailable(f"cannot make a memory cgroup under {parent} ({e.strerror}): this needs root "
                                   "and a writable cgroup file system (a container may not give one)") from None
    from course_utils.kernel.launch.processes import watchdog

    guard = watchdog("call", f"{__name__}:remove", str(group), str(wait))     # a kernel killed meanwhile: it removes it
    try:
        yield group / "cgroup.procs"
    finally:
        remove(group, wait)
        guard.kill()
        guard.wait()


def remove(group: Path | str, wait: float | str = 10.0) -> None:
    """Remove the memory cgroup ``group`` once no process is left in it; SIGKILL what is still in it after ``wait``
    seconds. Also what a capped launch's watchdog does when the kernel that made the group dies."""
    group, wait = Path(group), float(wait)
    deadline = time.monotonic() + wait
    while group.exists():
        try:
            group.rmdir()                  # only succeeds once no process is left in it
            break
        except OSError:
            if time.monotonic() > deadline:
                for pid in (group / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + wait
            time.sleep(0.05)


def oom_kills(group: Path) -> int:
    """How many processes the out-of-memory killer ended in the memory cgroup ``group`` (its folder): the
    ``oom_kill`` line of cgroup v2's ``memory.events`` or of v1's ``memory.oom_control`` (kernels from 4.13); 0 when
    the cgroup is gone or does not count them."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            for line in (Path(group) / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return 0


def available() -> bool:
    """Whether this machine gives the course memory cgroups (a small one is made and removed to find out)."""
    try:
        with memory_cap(16):
            return True
    except MemoryCapUnavailable:
        return False
