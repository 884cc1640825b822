"""Which processes belong to a run, ending processes (SIGTERM, then SIGKILL for what is left), and the launch's
watchdog (``python -m course_utils.common.reaper``): the one place for each of these rules.

Standard library only, read from ``/proc`` (Linux): the watchdog is a process of its own for every launch and
starts in a few tens of milliseconds; :mod:`course_utils.kernel.launch.processes`, the sshd and the op build end their
processes with :func:`end` too.

The watchdog gets SIGTERM when the kernel that started the launch dies (``PR_SET_PDEATHSIG``, set by its
starter; it also notices a new parent process id, in case the kernel died before that took effect), and then
ends the launch's process groups and every process of its run folder, and removes its ``/dev/shm`` buffers. The
deepspeed CLI does not forward SIGTERM to its launcher on a single node, so killing the CLI alone would orphan
the ranks; and a killed kernel never reaches the runner's own cleanup. A launch over ssh gets SIGKILL first (see
:func:`course_utils.kernel.launch.processes.kill_ssh_launch` for why).
"""
from __future__ import annotations

import glob
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Callable, Iterable

from course_utils.common import run_folder

if TYPE_CHECKING:          # the watchdog imports this module: what only call() needs is imported there
    import subprocess
    from pathlib import Path


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent, process group) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _runs(stat: tuple[str, int, int] | None) -> bool:
    return stat is not None and stat[0] not in ("Z", "X")


def _pids() -> list[int]:
    try:
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != os.getpid()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    return _runs(_stat(pid))


def in_groups(groups: Iterable[int]) -> list[int]:
    """The live processes of these process groups."""
    wanted = set(groups)
    return [pid for pid in _pids() if _runs(s := _stat(pid)) and s[2] in wanted] if wanted else []


def marked(setting: str, in_command_line: str | None = None, prefix: bool = False) -> list[int]:
    """The live processes whose environment holds ``setting`` (``NAME=value``, exactly; with ``prefix``, a value
    that starts with it), or whose command line holds ``in_command_line`` (default: ``setting`` itself)."""
    env_mark, line_mark, found = setting.encode(), (in_command_line or setting).encode(), []

    def in_environment(entries: list[bytes]) -> bool:
        return any(e.startswith(env_mark) for e in entries) if prefix else env_mark in entries

    for pid in _pids():
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    text = f.read()
            except OSError:
                continue
            if in_environment(text.split(b"\0")) if part == "environ" else (line_mark in text):
                if alive(pid):
                    found.append(pid)
                break
    return found


def of_run(run_dir: str | os.PathLike) -> list[int]:
    """The live processes of a launch: their environment names its run folder (``COURSE_RUN_DIR``), or their
    command line sets it (the shell sshd starts on each host of a launch over ssh sets it there)."""
    return marked(f"{run_folder.ENV}={run_dir}")


def _signal(pids: Iterable[int], groups: Iterable[int], sig: int) -> None:
    for g in groups:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end(pids: Callable[[], list[int]] = list, groups: Iterable[int] = (), grace: float = 5.0,
        at_once: bool = False, rounds: int = 3) -> bool:
    """End the processes ``pids()`` finds and the process groups ``groups``: SIGTERM, then SIGKILL for whatever is
    left after ``grace`` seconds (``at_once``: SIGKILL only). ``pids`` is asked again each time, so a process started
    meanwhile (a node's launcher starting a rank) is ended as well, for up to ``rounds`` rounds. True when nothing
    is left."""
    groups = list(groups)

    def left() -> list[int]:
        return sorted(set(pids()) | set(in_groups(groups)))
    steps = ((signal.SIGKILL, 2.0),) if at_once else ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0))
    rest = left()           # one scan of /proc per look: finding a run's processes reads every process's environment
    for _ in range(rounds):
        if not rest:
            return True
        for sig, wait in steps:
            _signal(rest, groups, sig)
            deadline = time.monotonic() + wait
            while (rest := left()) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not rest:
                break
    return not rest


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End ``proc`` and everything it started, with their process groups (a notebook's kernel runs in a session of
    its own, a launch's ranks and watchdog in groups of their own): SIGTERM, SIGKILL after ``grace`` seconds."""
    family = tree(proc.pid)
    groups = set()
    for pid in family:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            pass
    groups.discard(os.getpgrp())
    end(lambda: sorted({p for pid in family for p in tree(pid)}), groups, grace=grace)
    proc.wait()


def call(command: list[str], log: Path, timeout: float, env: dict | None = None, cwd: Path | None = None,
         grace: float = 5.0) -> int | None:
    """Run ``command`` in a session of its own, its output to ``log`` (a file: nothing left running can hold a pipe
    open); its exit status, or None when it was stopped at ``timeout`` seconds (:func:`stop`). An interrupt stops it
    too, and goes on."""
    import subprocess

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    try:
        return proc.wait(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        stop(proc, grace)
        return None
    except BaseException:
        stop(proc, grace)
        raise


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it (from each process's parent in ``/proc``)."""
    stats = {p: _stat(p) for p in _pids()}
    children: dict[int, list[int]] = {}
    for p, st in stats.items():
        if st is not None:
            children.setdefault(st[1], []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return [p for p in out if _runs(stats.get(p) if p in stats else _stat(p))]


def watch_parent(parent: int, on_death: Callable[[], None]) -> None:
    """A watchdog's life: wait until the process that started it dies (SIGTERM from ``PR_SET_PDEATHSIG``, or a new
    parent process id), then call ``on_death`` and exit. Its starter blocks SIGTERM until the handler is in place
    (``course_utils.kernel.launch.processes.watchdog``), so a parent that died meanwhile is not missed. A second
    SIGTERM (a dying kernel can bring two) is ignored once it acts: run inside the first, it would abandon it."""
    def ended(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        on_death()
        sys.exit(0)
    signal.signal(signal.SIGTERM, ended)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})   # its starter blocked it until now: a pending one runs here
    while True:
        time.sleep(1)
        if os.getppid() != parent:
            ended()


def end_launch(shm: str, run_dir: str, over_ssh: bool, groups: list[int]) -> None:
    """What a launch's watchdog does when the kernel died: end the launch's groups and run, remove its buffers."""
    if over_ssh:
        _signal((), groups, signal.SIGKILL)
    end(lambda: of_run(run_dir), groups, grace=3.0, rounds=1)
    for path in glob.glob(shm):
        try:
            os.unlink(path)
        except OSError:
            pass


def main(argv: list[str]) -> None:
    """``launch <parent> <shm glob> <run folder> ssh|local <group>...``: a launch's watchdog;
    ``call <parent> <module>:<function> <argument>...``: at the parent's death, import the function and call it
    (a service the course started, as the Slurm cluster does)."""
    kind, parent = argv[0], int(argv[1])
    if kind == "launch":
        watch_parent(parent, lambda: end_launch(argv[2], argv[3], argv[4] == "ssh", [int(g) for g in argv[5:]]))
    elif kind == "call":          # imported now, while SIGTERM is still blocked: at the parent's death it only runs
        import importlib
        module, _, function = argv[2].partition(":")
        act = getattr(importlib.import_module(module), function)
        watch_parent(parent, lambda: act(*argv[3:]))
    else:
        raise SystemExit(f"usage: python -m course_utils.common.reaper launch|call <parent pid> ...: not {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
