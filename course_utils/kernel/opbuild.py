"""The background build of DeepSpeed's ops, and waiting for one before a launch that loads it.

``make course`` and ``make lab`` start sooner by building at set-up only what the first notebooks load
(:func:`course_utils.kernel.ops.first_ops`); the others build here, one after another, in a process of their own
(``python -m course_utils.kernel.opbuild --build --state <file>``) whose output goes to ``build/ops-build.log``. Its
state file, beside the ops in ``TORCH_EXTENSIONS_DIR``, says which op it builds and since when; a launch that
loads an op still to come waits for it (:func:`wait_for_launch`, one line: which op, about how long). Two
processes never build one op at once: torch's JIT loader holds ``<op>/lock`` while it compiles
(``torch.utils.file_baton.FileBaton``), and a rank that loads the op meanwhile waits for that lock to go.
Whoever starts the background build stops it (:func:`stop`) before it exits, so no build outlives
``make course`` or ``make lab``.
"""
from __future__ import annotations

import argparse
import json
import re
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from course_utils.kernel import ops as _ops
from course_utils.common import paths, reaper
from course_utils.kernel.progress import minutes, say, timed

STATE = "course-background-build.json"
LOG = "ops-build.log"


def state_file() -> Path:
    return _ops.extensions_dir() / STATE


def write_state(path: Path, todo: list[_ops.Op], done: dict[str, str], building: str | None,
                pid: int | None = None, factor: float = 1.0, cpu_ratio: float | None = None) -> None:
    """The builder's progress, for the waiting side: its pid, the ops to build, which now and since when, how much
    slower than the table's estimates the ops built so far took (:class:`Pace`), and how much CPU their compilers
    needed against the table's (``cpu_ratio``, None before the first: :func:`cpu_needed`)."""
    state = {"pid": pid or os.getpid(), "ops": [op.key for op in todo], "done": done, "building": building,
             "since": time.time(), "factor": factor, "cpu_ratio": cpu_ratio,
             "cpu_at_start": None if pid else _compiler_seconds()}    # the builder's own: its compilers' CPU so far
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")      # the starter and the build both write it
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running op build (not a zombie, nor a process that got the pid of a build killed long ago)."""
    if not reaper.alive(pid):
        return False
    try:       # empty for a moment after the build's exec: unknown, so counted as the build
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return not cmdline or b"course_utils.kernel.opbuild" in cmdline


def raw_state(path: Path | None = None) -> dict | None:
    """What the state file says, whether or not its builder still runs (None: no file)."""
    try:
        return json.loads((path or state_file()).read_text())
    except (OSError, ValueError):
        return None


def read_state(path: Path | None = None) -> dict | None:
    """The running background build's state, or None when none runs (no file, or its builder is gone or done)."""
    state = raw_state(path)
    return state if state and _alive(int(state.get("pid", 0))) and state.get("building") else None


def cpu_needed(key: str, state: dict | None = None) -> float:
    """About the CPU seconds op ``key``'s compilers need in all (measured; twice its idle estimate where unmeasured),
    times what the ops this run's background build has built so far needed against the table (``state``'s
    ``cpu_ratio``, kept between ½ and 2): a compile takes more CPU seconds in a slow hour than in a fast one."""
    op = _ops.by_key(key)
    ratio = (state or {}).get("cpu_ratio")
    scale = min(2.0, max(0.5, ratio)) if isinstance(ratio, (int, float)) and ratio > 0 else 1.0
    return scale * float(op.cpu_seconds or 2 * op.seconds) if op else 120.0


def pending(names: list[str], state: dict | None, pace: float | None = None) -> list[tuple[str, float]]:
    """The ops of ``names`` the background build has still to finish, each with the seconds until it is ready
    (the op being built: its estimate less its time so far; those after it: their estimates added on). ``pace``: the
    CPU seconds a second its compilers get now (:func:`recent_pace`), for the op being built."""
    if state is None:
        return []
    table = {op.key: op.seconds for ops in _ops.COURSE_OPS.values() for op in ops}
    queue = [n for n in state["ops"] if n not in state["done"]]
    out, ahead = [], 0.0
    for n in queue:
        seconds = table.get(n, 60) * state.get("factor", 1.0)
        if pace is not None:         # a notebook waits: its cores are free for the compilers, two files at a time
            seconds = cpu_needed(n, state) / min(2, os.cpu_count() or 1)
        if n == state["building"]:
            seconds = left_of_building(n, seconds, time.time() - state["since"], state["since"],
                                       cpu=(compilers_cpu(state), cpu_needed(n, state)), pace=pace)
        ahead += seconds
        if n in names:
            out.append((n, ahead))
    return out


def compiled(key: str, since: float) -> tuple[int, int] | None:
    """(object files ninja has written since ``since``, object files the op's ``build.ninja`` lists): how far the
    op's compile has got (torch writes that file before it compiles); None before the file is there."""
    op = _ops.by_key(key)
    try:
        targets = re.findall(r"^build (\S+\.o):", (_ops.folder(op) / "build.ninja").read_text(), re.M) if op else []
    except OSError:
        return None
    done = 0
    for t in targets:
        try:
            done += (_ops.folder(op) / t).stat().st_mtime >= since
        except OSError:
            pass
    return (done, len(targets)) if targets else None


def compilers_cpu(state: dict) -> float | None:
    """CPU seconds the background build's compilers have spent on the op it builds now: the builder's reaped children
    (``cutime``, less what it had at the op's start) and every live process under it (ninja, the compilers). None
    where /proc cannot tell (another system, a build that has just started)."""
    try:
        pid, at_start = int(state["pid"]), state.get("cpu_at_start")
        if at_start is None:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                stats[int(entry)] = (int(fields[1]), [int(f) for f in fields[11:15]])   # ppid; utime stime cutime cstime
        if pid not in stats:
            return None
        children: dict[int, list[int]] = {}
        for p, (ppid, _) in stats.items():
            children.setdefault(ppid, []).append(p)
        total, todo = (stats[pid][1][2] + stats[pid][1][3]) / tick - at_start, list(children.get(pid, []))
        while todo:
            p = todo.pop()
            total += sum(stats[p][1]) / tick
            todo += children.get(p, [])
        return max(0.0, total)
    except (KeyError, ValueError, TypeError, IndexError, OSError):
        return None


def left_of_building(key: str, estimate: float, elapsed: float, since: float,
                     cpu: tuple[float | None, float] = (None, 0.0), pace: float | None = None) -> float:
    """Seconds until the op being built is ready. Once ninja has written every object file, its link and load: about
    one file's time. Before that, ``cpu``: (CPU seconds its compilers have spent so far, about
    what they need in all, :func:`cpu_needed`): the rest at ``pace``, the CPU seconds a second they get now (a
    notebook that waits has freed its cores: the pace since the op started, while two notebooks ran beside, says
    minutes where seconds are left; an op started less than 10 s ago is still loading torch's build tools, so the
    rest at two cores, the two files ninja compiles at once, stands in), else, once they have run a while, at their
    pace so far. Else its estimate less
    its time so far; once it has run past that, its own pace so far: the time per object file written, for the files
    still to compile and the link (about one file's time), or, before any file is written, as long again."""
    spent, needed = cpu
    progress = compiled(key, since)
    if progress and progress[0] >= progress[1] and elapsed >= 15:
        # every object file written: the link and the load are left, about one file's time, however much CPU the op
        # was measured to need before (a fresh run's async_io needed 323 s where another needed 562 s; with 562 a
        # notebook that waited for its link was told "about 5 min" and waited 50 s)
        return max(10.0, elapsed / progress[0])
    if spent is not None and pace is not None:
        if spent >= needed:           # past what it was measured to need: its link and load are left
            return 10.0
        if elapsed < 10:
            return max(5.0, (needed - spent) / min(2, os.cpu_count() or 1))
        if pace > 0.05:
            return max(5.0, (needed - spent) / pace)
    if spent is not None and elapsed >= 15 and spent >= 5 and spent < needed:
        return max(10.0, (needed - spent) * elapsed / spent)
    if elapsed < estimate - 10:
        return estimate - elapsed
    if not progress or not progress[0]:
        return max(10.0, elapsed)
    done, total = progress
    return max(10.0, elapsed / done * (total - done + 1))


def waiting_line(what: str, waits: list[tuple[str, float]]) -> str:
    ops = ", ".join(n for n, _ in waits)
    needed = {op.key: op.needed_by for ops in _ops.COURSE_OPS.values() for op in ops}
    return (f"⏳ {what} waits for DeepSpeed's {ops} op{'s' if len(waits) > 1 else ''} — needed by "
            f"{needed.get(waits[0][0], 'this launch')} — building in the background: about {minutes(waits[-1][1])} "
            f"left (log: {paths.relative(paths.build_dir() / LOG)})")


def wait_for(names: list[str], what: str, quiet: bool = False, poll: float = 1.0,
             read: Callable[[], dict | None] = read_state) -> float:
    """Block until the background build has built ``names`` (or stopped); say so in one line if it must wait.
    Returns the seconds waited."""
    waits = pending(names, read())
    if not waits:
        return 0.0
    started = time.monotonic()
    if not quiet:
        pace = recent_pace(read)
        waits = pending(names, read(), pace)
        if not waits:
            return time.monotonic() - started
        say(waiting_line(what, waits))
    while pending(names, read()):
        time.sleep(poll)
    return time.monotonic() - started


def recent_pace(read: Callable[[], dict | None] = read_state, seconds: float = 2.0) -> float | None:
    """The CPU seconds a second the background build's compilers get now, over ``seconds``; None when /proc cannot
    tell or the build moved on to another op meanwhile."""
    before = read()
    first = compilers_cpu(before) if before else None
    if first is None:
        return None
    time.sleep(seconds)
    after = read()
    if not after or after.get("building") != before.get("building") or after.get("since") != before.get("since"):
        return None
    second = compilers_cpu(after)
    return None if second is None else (second - first) / seconds


NOTEBOOK_ENV = "COURSE_NOTEBOOK"     # set by ``make course`` for each notebook's kernel


def wait_for_launch(script_stem: str, quiet: bool = False) -> float:
    """Before a launch of ``script_stem``: wait for the ops it may load that the background build has yet to build
    (by its ``NN_`` prefix, :func:`course_utils.kernel.ops.for_script`; for a script without one, by the notebook that
    ``make course`` runs, else every op). A build lock of one of them that a killed process left is removed first
    (:func:`course_utils.kernel.ops.clear_stale_locks`): its ranks would wait for it until the launch's timeout."""
    stem = script_stem if script_stem[:2].isdigit() else os.environ.get(NOTEBOOK_ENV, script_stem)
    _ops.clear_stale_locks(_ops.for_script(stem))
    state = read_state()
    if state is None:
        return 0.0
    names = [op.key for op in _ops.for_script(stem)]
    return wait_for(names, f"This launch ({script_stem})", quiet)


def start(queue: list[str] | None = None) -> subprocess.Popen | None:
    """Start building the missing ops in the background (None when none is missing or a build already runs), in the
    order the notebooks of ``queue`` (stems, in the order they start) need them (:func:`course_utils.kernel.ops.build_order`)."""
    todo = _ops.missing()
    if not todo or read_state() is not None:
        return None
    if queue:
        todo = _ops.build_order(todo, queue)
    log = paths.build_dir() / LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "course_utils.kernel.opbuild", "--build", "--state", str(state_file()),
                                 *(["--queue", *queue] if queue else [])],
                                cwd=paths.ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    write_state(state_file(), todo, {}, todo[0].key, proc.pid, _ops.BESIDE_NOTEBOOKS)   # waiters see it from now
    total = _ops.BESIDE_NOTEBOOKS * sum(op.seconds for op in todo)
    say(f"Building DeepSpeed's {', '.join(op.key for op in todo)} in the background (about {minutes(total)} beside "
        f"the notebooks on 2 cores; log: {paths.relative(log)}): a notebook that needs one starts once it is built.")
    return proc


def stop(proc: subprocess.Popen | None, grace: float = 20.0) -> bool:
    """End the background build if it still runs (SIGTERM: torch releases its build lock; then SIGKILL to its
    whole process group). True when it had to be stopped before it finished."""
    if proc is None or proc.poll() is not None:
        return False
    state = read_state()
    reaper.end(groups=[proc.pid], grace=grace, rounds=1)
    proc.wait()
    if state is not None and state["building"]:      # killed while compiling: its lock would block every later build
        op = _ops.by_key(state["building"])
        lock = _ops.folder(op) / "lock" if op is not None else Path(os.devnull)
        if lock.exists() and lock.stat().st_mtime >= state["since"] - 1:
            lock.unlink(missing_ok=True)
    state_file().unlink(missing_ok=True)
    return True


def building_now() -> str | None:
    """The op the background build compiles now (its lock is not a killed launch's leftover), or None."""
    state = read_state()
    return state["building"] if state else None


def news(reported: dict[str, str], state: dict | None) -> list[str]:
    """Lines for what the background build did since the last call (for ``make course``): each op it finished, and
    the op it goes on with. ``reported`` (op → what was said) is updated."""
    if state is None:
        return []
    every = [op.key for op in _ops.course_ops()]
    needed = {op.key: op.needed_by for ops in _ops.COURSE_OPS.values() for op in ops}
    lines = []
    for name, outcome in state.get("done", {}).items():
        if reported.get(name) != outcome:
            reported[name] = outcome
            n = every.index(name) + 1 if name in every else 0
            lines.append(f"  op {n} of {len(every)}, {name}: {outcome} (background build)")
    nxt = state.get("building")
    if nxt and reported.get(nxt) is None:
        reported[nxt] = ""
        waits = pending([nxt], read_state())
        n = every.index(nxt) + 1 if nxt in every else 0
        lines.append(f"  op {n} of {len(every)}, {nxt} — needed by {needed.get(nxt, '?')} — building in the background,"
                     f" about {minutes(waits[0][1] if waits else 60)} left")
    return lines


def end_with_parent(poll: float = 2.0) -> threading.Thread:
    """In the background build: should the process that started it die without stopping it (killed, not
    interrupted), end the build the same way :func:`stop` would (SIGTERM to its process group, compilers included)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os.killpg(os.getpgid(0), signal.SIGTERM)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def run_beside(command: list[str]) -> int:
    """Run ``command`` (``make lab``'s JupyterLab) while the missing ops build; stop the build when it exits."""
    proc = start()
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        if stop(proc):
            say("The background op build stopped before it finished; the next `make course` or `make lab` goes on with it.")


class Pace:
    """How much slower than the table this machine builds (its load, its cores): the ops built so far in this run,
    their time over their estimate (``start`` before the first). The later ops' estimates are scaled by it. (The
    background build keeps a second one for its compilers' CPU against the table's.)"""

    def __init__(self, start: float = 1.0) -> None:
        self.start, self.estimated, self.took = start, 0.0, 0.0

    @property
    def ratio(self) -> float | None:
        """What the ops added so far took over the table's figures for them (None before the first)."""
        return self.took / self.estimated if self.estimated else None

    @property
    def factor(self) -> float:
        return max(1.0, self.ratio) if self.estimated else self.start

    def add(self, estimated: float, took: float) -> None:
        self.estimated, self.took = self.estimated + estimated, self.took + took


def _compiler_seconds() -> float:
    """CPU seconds of this process's finished children (the compilers): an op's cost apart from the machine's load."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(ops: list[_ops.Op], state: Path | None = None) -> int:
    """Build ``ops`` one after another in this process, saying which, for what, and about how long is left.

    With ``state`` (the background build) each op's progress also goes to that file for the runner to read. A
    SIGTERM ends the build cleanly: torch's build lock is released, so the next build can take it."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if state is not None:
        end_with_parent()
    every, done = _ops.course_ops(), {}
    failed, slower = 0, Pace(_ops.BESIDE_NOTEBOOKS if state is not None else 1.0)
    compilers = Pace()      # the built ops' compilers' CPU against the table's (:func:`cpu_needed`)
    for op in ops:
        n = every.index(op) + 1 if op in every else 0
        left = slower.factor * sum(o.seconds for o in ops if o.key not in done)
        if state is not None:
            write_state(state, ops, done, building=op.key, factor=slower.factor,
                        cpu_ratio=compilers.ratio)
        started, cpu_started = time.monotonic(), _compiler_seconds()
        with timed(f"op {n} of {len(every)}, {op.key} — needed by {op.needed_by}",
                            slower.factor * op.seconds, left):
            outcome = _ops.build_one(op)
        done[op.key] = outcome
        failed += outcome == "failed"
        took, cpu = time.monotonic() - started, _compiler_seconds() - cpu_started
        if outcome == "built":
            slower.add(op.seconds, took)
            if op.cpu_seconds:
                compilers.add(op.cpu_seconds, cpu)
        say(f"  {op.key}: {outcome}" + (f" in {took:.0f} s (compilers: {cpu:.0f} s "
                                                   f"of CPU)" if outcome == "built" else
                                                   " (cannot build here: see `ds_report`)" if outcome == "skipped" else ""))
    if state is not None:
        write_state(state, ops, done, building=None)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build", action="store_true", help="build every op still missing, here and now")
    parser.add_argument("--first", action="store_true", help="with --build: only the ops the first notebooks load")
    parser.add_argument("--background", nargs=argparse.REMAINDER,
                        help="run this command (e.g. jupyter lab) while the missing ops build in the background")
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)   # the background build's own process
    parser.add_argument("--queue", nargs="*", help=argparse.SUPPRESS)   # its notebooks, in the order they start
    a = parser.parse_args(argv)
    if a.background is not None:
        return run_beside(a.background)
    if a.build:
        todo = _ops.missing(_ops.first_ops() if a.first else None)
        if a.queue:
            todo = _ops.build_order(todo, a.queue)
        return build(todo, a.state) if todo else 0
    return _ops.main()


if __name__ == "__main__":
    sys.exit(main())
