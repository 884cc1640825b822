"""Starting and ending the processes of a launch, so that no rank outlives the cell that started it.

Each launcher runs in a session (process group) of its own. Ending a launch signals those groups and
every descendant (SIGTERM, then SIGKILL for what is left); a watchdog process does the same when the
kernel that started the launch is killed outright; and the shared-memory buffers DeepSpeed's CPU
all-reduce leaves in /dev/shm are removed either way.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Mapping

import psutil

from .. import paths

SHM_DIR = Path("/dev/shm")
STACKS_DIR = "stacks"     # in the run folder: each rank's faulthandler file (the rank hook opens it)


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


def release_build_locks(since: float, folder: Path | None = None) -> list[Path]:
    """Remove the lock files of JIT op builds that a killed launch left (``torch.utils.file_baton``): a rank killed
    while compiling an op (the first launch builds DeepSpeed's shm all-reduce) leaves ``<op>/lock`` behind, and
    every later build of that op would wait for it forever. Only locks created at or after ``since`` (the
    launch's start, wall clock) are touched. Returns what was removed."""
    root = folder or Path(os.environ.get("TORCH_EXTENSIONS_DIR") or paths.torch_extensions_dir())
    removed = []
    for lock in root.glob("*/lock"):
        try:
            if lock.stat().st_mtime >= since:
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


def rank_stacks(run_dir: Path, wait: float = 3.0) -> dict[int, str]:
    """Every live rank's Python stacks, all threads, as ``{rank: text}``: each rank of the launch in ``run_dir``
    gets SIGUSR1, on which the rank hook's ``faulthandler`` writes them to ``stacks/rank<N>-<pid>.txt``.

    faulthandler writes from its C signal handler, so a rank blocked inside a collective (in C++, without the
    GIL) answers too. Only processes whose environment names this run folder are signalled (a pid that has
    since been reused by another process is left alone). Waits up to ``wait`` seconds for the files to settle.
    """
    asked: dict[int, tuple[Path, int]] = {}
    for path in sorted((run_dir / STACKS_DIR).glob("rank*-*.txt")):
        rank, _, pid = path.stem[len("rank"):].partition("-")
        try:
            proc = psutil.Process(int(pid))
            if proc.environ().get("COURSE_RUN_DIR") != str(run_dir):
                continue
            before = path.stat().st_size
            proc.send_signal(signal.SIGUSR1)
            asked[int(rank)] = (path, before)
        except (psutil.Error, ValueError, OSError):
            continue
    deadline, sizes = time.monotonic() + wait, {}
    while asked and time.monotonic() < deadline:
        now = {r: path.stat().st_size for r, (path, _) in asked.items()}
        if all(now[r] > before for r, (_, before) in asked.items()) and now == sizes:
            break
        sizes = now
        time.sleep(0.2)
    stacks = {}
    for rank, (path, before) in sorted(asked.items()):
        with open(path, "rb") as f:
            f.seek(before)
            text = f.read().decode(errors="replace")
        if text.strip():
            stacks[rank] = text
    return stacks


def main_thread_stack(text: str, frames: int = 12) -> str:
    """The main thread's frames from one faulthandler dump (the thread whose oldest frame is ``<module>``),
    most recent call first; of a deeper stack, the innermost and the outermost ``frames // 2`` (where it waits,
    and which line of the script got it there)."""
    blocks = [b for b in text.strip().split("\n\n") if "(most recent call first)" in b]
    main = next((b for b in blocks if b.rstrip().endswith("in <module>")), blocks[0] if blocks else "")
    lines = [_short_paths(line.strip()) for line in main.splitlines()[1:]]
    if len(lines) > frames:
        lines = lines[:frames // 2] + [f"... ({len(lines) - 2 * (frames // 2)} frames)"] + lines[-(frames // 2):]
    return "\n".join(lines)


def _short_paths(frame: str) -> str:
    """A faulthandler frame with installed packages named from their package (``torch/...``) and the
    course's own files from the repository root."""
    from .. import paths

    frame = re.sub(r'"[^"]*/site-packages/', '"', frame)
    return frame.replace(f'"{paths.ROOT}/', '"')
