"""A launch's run folder, ``build/runs/<time>-<script>-<id>/``: the one module that names what is in it.

The runner makes the folder and hands it to every process of the launch in ``COURSE_RUN_DIR``; the ranks, the
rank hook (``rank_hook/sitecustomize.py``), the runner and the failure reader all build its paths here::

    launch.log              the launch's whole output (the runner)
    ranks/                  each rank's own log (DeepSpeed's --enable_each_rank_log)
    metrics/rank<N>.jsonl   what each rank recorded (rank.record)
    finished/rank<N>        a rank that got to the end (scaffolding.finish, or the rank hook)
    failures/rank<N>.json   a rank's uncaught exception, with its time (the rank hook)
    stacks/rank<N>-<pid>.txt each rank's faulthandler file, written on SIGUSR1 (the rank hook)
    configs/<n>.json        each DeepSpeed config rank 0's DeepSpeedConfig read, once per distinct config (the rank hook)
    memory_limits/rank<N>   the memory cgroup a rank moved itself into (join_memory_cgroup)
    scratch/                folders nobody reads afterwards (scaffolding.scratch_dir)

Standard library only: the rank hook imports it at every process's start.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

ENV = "COURSE_RUN_DIR"
LOG = "launch.log"
RANKS = "ranks"
METRICS = "metrics"
FINISHED = "finished"
FAILURES = "failures"
STACKS = "stacks"
SCRATCH = "scratch"
CONFIGS = "configs"
MEMORY_LIMITS = "memory_limits"
_FALLBACK = "course-outside-a-launch"


def current() -> Path | None:
    """The run folder of the launch this process belongs to, or None outside the course's runner."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def here() -> Path:
    """Where a script writes files its ranks share: the run folder under the runner; run outside a launch (from a
    terminal, say), one folder in the system's temporary directory, the same for every process of the machine."""
    folder = current() or Path(tempfile.gettempdir()) / _FALLBACK
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def launch_log(run_dir: Path) -> Path:
    return Path(run_dir) / LOG


def ranks_dir(run_dir: Path) -> Path:
    return Path(run_dir) / RANKS


def metrics_file(run_dir: Path, rank: int | str) -> Path:
    return Path(run_dir) / METRICS / f"rank{rank}.jsonl"


def metrics_files(run_dir: Path) -> list[Path]:
    """Every rank's metrics file, in rank order."""
    return sorted((Path(run_dir) / METRICS).glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))


def failure_file(run_dir: Path, rank: int | str) -> Path:
    return Path(run_dir) / FAILURES / f"rank{rank}.json"


def failure_files(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / FAILURES).glob("rank*.json"))


def write_failure(rank: str, when: float, error: BaseException) -> None:
    """This rank's failure record in the current run folder (``failures/rank<N>.json``: the rank hook's for an
    uncaught exception, and a rank that ends itself at a limit): complete when it appears, as the runner reads it."""
    import json
    import os
    import traceback

    folder = current()
    if folder is None:            # a script run from a terminal: no runner reads it
        return
    try:
        path = failure_file(folder, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w") as f:
            json.dump({"rank": rank, "time": when, "error": f"{type(error).__name__}: {error}",
                       "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))}, f)
        os.replace(tmp, path)     # complete when it appears
    except OSError:
        pass


def stacks_file(run_dir: Path, rank: int | str, pid: int) -> Path:
    return Path(run_dir) / STACKS / f"rank{rank}-{pid}.txt"


def stacks_files(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / STACKS).glob("rank*-*.txt"))


def config_files(run_dir: Path) -> list[Path]:
    """The DeepSpeed configs rank 0 read, in the order it read them."""
    return sorted((Path(run_dir) / CONFIGS).glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0)


def scratch(run_dir: Path) -> Path:
    return Path(run_dir) / SCRATCH


def _ranks_in(folder: Path) -> set[int]:
    return {int(m[1]) for p in folder.glob("rank*") if (m := re.match(r"rank(\d+)", p.name))}


def finished_ranks(run_dir: Path) -> set[int]:
    """The ranks that left their finished mark."""
    return _ranks_in(Path(run_dir) / FINISHED)


def failed_ranks(run_dir: Path) -> set[int]:
    """The ranks that left a failure record."""
    return _ranks_in(Path(run_dir) / FAILURES)


def join_memory_cgroup(procs: str | Path) -> None:
    """Move this process into the memory cgroup whose ``cgroup.procs`` file is ``procs`` and, in a launch, leave a
    mark naming that cgroup: DeepSpeed's launcher does not say which rank a signal killed, the cgroup's own count of
    out-of-memory kills does (:func:`course_utils.kernel.launch.failures.failure_message` reads it)."""
    Path(procs).write_text(str(os.getpid()))
    run_dir, rank = current(), os.environ.get("RANK")
    if run_dir is None or rank is None:
        return
    try:
        mark = Path(run_dir) / MEMORY_LIMITS / f"rank{rank}"
        mark.parent.mkdir(exist_ok=True)
        mark.write_text(str(Path(procs).parent))
    except OSError:
        pass


def memory_cgroups(run_dir: Path) -> dict[int, Path]:
    """rank → the memory cgroup folder it joined (:func:`join_memory_cgroup`)."""
    folder = Path(run_dir) / MEMORY_LIMITS
    return {int(m[1]): Path(p.read_text().strip()) for p in sorted(folder.glob("rank*"))
            if (m := re.fullmatch(r"rank(\d+)", p.name))}


def mark_finished(rank: int | str | None = None) -> None:
    """Leave this rank's finished mark in its launch's run folder (nothing outside a launch)."""
    run_dir = current()
    if run_dir is None:
        return
    try:
        mark = Path(run_dir) / FINISHED / f"rank{os.environ.get('RANK', '0') if rank is None else rank}"
        mark.parent.mkdir(exist_ok=True)
        mark.touch()
    except OSError:
        pass


def end_rank(code: int = 0) -> None:
    """End this rank now, without the interpreter's teardown: the standard streams flushed, the finished mark left
    when it succeeded (the runner ends the launch once every rank has one), then ``os._exit(code)``. Tearing down
    what DeepSpeed and torch.distributed still hold can abort in gloo's threads ("terminate called without an
    active exception") after the work is done; :func:`course_utils.rank.scaffolding.finish` and the rank hook both
    end a rank here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == 0:
        mark_finished()
    os._exit(code)
