"""Starting and ending the processes of a launch, so that no rank outlives the cell that started it.

Each launcher runs in a session (process group) of its own. Ending a launch signals those groups and
every descendant (SIGTERM, then SIGKILL for what is left); a watchdog process does the same when the
kernel that started the launch is killed outright; and the shared-memory buffers DeepSpeed's CPU
all-reduce leaves in /dev/shm are removed either way.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping

import psutil

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


# The launch's watchdog: a tiny process that gets SIGTERM when the kernel that started the launch dies
# (see die_with_parent; it also notices a new parent process id, in case the kernel died before the
# prctl took effect) and then kills the launch's process groups and removes its /dev/shm buffers. The
# deepspeed CLI does not forward SIGTERM to its launcher on a single node, so killing the CLI alone
# would orphan the ranks; and a killed kernel never reaches release_shm_buffers.
# argv: parent pid, shm glob, process group ids.
_WATCHDOG = """
import glob, os, signal, sys, time
parent, shm, groups = int(sys.argv[1]), sys.argv[2], [int(g) for g in sys.argv[3:]]
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True
def end(*_):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass
        deadline = time.time() + 3
        while time.time() < deadline and any(alive(g) for g in groups):
            time.sleep(0.1)
    for path in glob.glob(shm):
        try:
            os.unlink(path)
        except OSError:
            pass
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
while True:
    time.sleep(1)
    if os.getppid() != parent:
        end()
"""


def start_watchdog(launchers: list[subprocess.Popen], port: int) -> subprocess.Popen:
    """Start the watchdog of these launchers (see ``_WATCHDOG``); kill it when the launch ends normally."""
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), shm_pattern(port),
                             *(str(p.pid) for p in launchers)],
                            preexec_fn=die_with_parent, stdin=subprocess.DEVNULL)


def signal_groups(launchers: Iterable[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to the process group of each launcher (each was started in a session of its own)."""
    for p in launchers:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(launchers: list[subprocess.Popen]) -> None:
    """SIGTERM every process of the launch (its groups and all descendants), then SIGKILL what is left."""
    victims: list[psutil.Process] = []
    for p in launchers:
        try:
            parent = psutil.Process(p.pid)
            victims += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    signal_groups(launchers, signal.SIGTERM)
    for v in victims:          # descendants that left the group (a rank calling setsid) are reached too
        try:
            v.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(victims, timeout=5)
    for v in alive:
        try:
            v.kill()
        except psutil.NoSuchProcess:
            pass
    signal_groups(launchers, signal.SIGKILL)
    for p in launchers:
        p.wait()
