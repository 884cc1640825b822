"""Starting and ending the processes of a launch, so that no rank outlives the cell that started it.

Each launcher runs in a session (process group) of its own. Ending a launch signals those groups and
every descendant (SIGTERM, then SIGKILL for what is left); a watchdog process does the same when the
kernel that started the launch is killed outright; and the shared-memory buffers DeepSpeed's CPU
all-reduce leaves in /dev/shm are removed either way.

A launch over ssh (``hosts=``) has processes outside those groups: pdsh puts each ssh client in a session of
its own, and on every host the node's launcher and its ranks are children of sshd, not of the launcher. Every
one of them carries the run folder in its environment (``COURSE_RUN_DIR``, from ``.deepspeed_env``), which is
how :func:`end_run_processes` and the watchdog find them (:func:`course_utils.common.reaper.of_run`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping

import psutil

from course_utils.common import paths, reaper

SHM_DIR = Path("/dev/shm")


def die_with_parent() -> None:
    """Runs in the child before exec: deliver SIGTERM to it if the process that started it dies.

    Without it, a kernel killed outright (a restart, an OOM kill) leaves its launches running, since
    none of our Python code gets the chance to clean up. Linux only; elsewhere a no-op.
    """
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watchdog_preexec() -> None:
    """A watchdog's :func:`die_with_parent`, with SIGTERM blocked until it is ready for it and SIGINT ignored.

    The blocked mask survives ``exec``: a parent that dies while the watchdog's interpreter is still starting (a
    kernel killed a moment after a launch, a loaded machine) leaves the SIGTERM pending, and it is delivered once
    :func:`course_utils.common.reaper.watch_parent` has its handler in place, instead of killing the watchdog
    before it could end anything. An ignored SIGINT stays ignored in the new interpreter (Python installs its
    KeyboardInterrupt handler only where SIGINT is not ignored)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def watchdog(*argv: str) -> subprocess.Popen:
    """Start ``python -m course_utils.common.reaper <argv>`` for the process calling this: it acts when this
    process dies, however it dies (see :func:`course_utils.common.reaper.main`).

    In a session of its own: Jupyter signals a kernel's whole process group, SIGINT for the stop button (a
    watchdog in that group would die of KeyboardInterrupt and leave the cluster or launch it watches unwatched) and
    SIGKILL when it kills a kernel (which would kill the watchdog with it, before it could act)."""
    return subprocess.Popen([sys.executable, "-m", "course_utils.common.reaper", argv[0], str(os.getpid()), *argv[1:]],
                            cwd=paths.ROOT, preexec_fn=_watchdog_preexec, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def shm_pattern(port: int) -> str:
    """The glob of the buffers one launch's CPU all-reduce creates (DeepSpeed's shm comm op).

    Each CPU rank creates /dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank> (about 66 MB).
    The port is unique per launch, so the pattern matches this launch's buffers and no one else's.
    """
    return str(SHM_DIR / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*")


def release_shm_buffers(port: int) -> None:
    """Remove the shared-memory buffers DeepSpeed's CPU all-reduce leaves behind.

    DeepSpeed never unlinks them (shm.cpp's shared_close is not called), so every launch would keep
    ~66 MB per rank of RAM until reboot.
    """
    for path in SHM_DIR.glob(Path(shm_pattern(port)).name):
        try:
            path.unlink()
        except OSError:
            pass


def release_build_locks(since: float, folder: Path | None = None) -> list[Path]:
    """Remove the lock files of JIT op builds that a killed launch left (``torch.utils.file_baton``): a rank killed
    while compiling an op (the first launch builds DeepSpeed's shm all-reduce) leaves ``<op>/lock`` behind, and
    every later build of that op would wait for it forever. Only locks created at or after ``since`` (the
    launch's start, wall clock) are touched. Returns what was removed."""
    from course_utils.kernel import ops
    from course_utils.kernel.opbuild import building_now     # the background op build's lock is its own, not the launch's
    roots = [folder] if folder else sorted({ops.extensions_dir(), paths.torch_extensions_dir("cpu")})  # a GPU machine's CPU ranks build in the second
    busy = ops.by_key(building_now() or "")
    busy_lock = ops.folder(busy) / "lock" if busy is not None else None
    removed = []
    for lock in (lock for root in roots for lock in root.glob("*/lock")):
        try:
            if lock.stat().st_mtime >= since and lock != busy_lock:
                lock.unlink()
                removed.append(lock)
        except OSError:
            pass
    return removed


def start_launchers(commands: list[list[str]], cwd: Path, env: Mapping[str, str]) -> list[subprocess.Popen]:
    """One ``deepspeed`` launcher per command, each in a new session, output merged into one text pipe."""
    launchers: list[subprocess.Popen] = []
    try:
        for cmd in commands:
            launchers.append(subprocess.Popen(cmd, cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True, errors="replace",
                                              start_new_session=True))
    except BaseException:
        kill_group(launchers)
        raise
    return launchers


def start_watchdog(launchers: list[subprocess.Popen], port: int, run_dir: Path,
                   over_ssh: bool = False) -> subprocess.Popen:
    """Start the launch's watchdog (:func:`course_utils.common.reaper.end_launch`), which ends the launch should the kernel
    die; kill it when the launch ends normally."""
    return watchdog("launch", shm_pattern(port), str(run_dir), "ssh" if over_ssh else "local",
                    *(str(p.pid) for p in launchers))


def signal_groups(launchers: Iterable[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to the process group of each launcher (each was started in a session of its own)."""
    for p in launchers:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(launchers: list[subprocess.Popen]) -> None:
    """SIGTERM every process of the launch (its groups and all descendants, a rank calling setsid included), then
    SIGKILL what is left (:func:`course_utils.common.reaper.end`)."""
    tree = [pid for p in launchers for pid in reaper.tree(p.pid)]
    reaper.end(lambda: [pid for pid in tree if reaper.alive(pid)], [p.pid for p in launchers], rounds=1)
    for p in launchers:
        p.wait()


def as_processes(pids: Iterable[int]) -> list[psutil.Process]:
    """``pids`` as psutil processes (those gone meanwhile left out), for their names and states."""
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return found


def run_processes(run_dir: Path) -> list[psutil.Process]:
    """The live processes of the run (:func:`course_utils.common.reaper.of_run`): the launch's launcher, pdsh and its ssh
    clients, and on every host of a launch over ssh the node's launcher and its ranks, and the shell sshd starts
    there (``export COURSE_RUN_DIR=...; cd ...; python -m deepspeed.launcher.launch ...``)."""
    return as_processes(reaper.of_run(run_dir))


def end_run_processes(run_dir: Path, grace: float = 5.0, at_once: bool = False) -> None:
    """SIGTERM every process of the run, SIGKILL what is left after ``grace`` seconds (``at_once``: SIGKILL only,
    for launchers left idle after their ranks are done); again while any remain (a node's launcher may start a
    rank while it is being ended)."""
    reaper.end(lambda: reaper.of_run(run_dir), grace=grace, at_once=at_once)


def kill_ssh_launch(launchers: list[subprocess.Popen], run_dir: Path, at_once: bool = False) -> None:
    """End a launch over ssh: its launcher's group with SIGKILL, then every process of the run on every host
    (:func:`end_run_processes`; ``at_once`` once the ranks are done).

    Not SIGTERM first, as :func:`kill_group` does: on SIGTERM DeepSpeed's launcher runs its pdsh kill command,
    ``pdsh -w <hosts> pkill -f "<python> -u -m deepspeed.launcher.launch"``, which ends every DeepSpeed launch
    of this Python on those hosts (another notebook's, another test's), not only this one.
    """
    signal_groups(launchers, signal.SIGKILL)
    end_run_processes(run_dir, at_once=at_once)
    for p in launchers:
        p.wait()
