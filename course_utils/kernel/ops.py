"""DeepSpeed's JIT-built ops that the course uses: which launches load each, and building them once per venv.

Set-up builds only the ops that the first notebooks load (on a CPU machine the shared-memory all-reduce every
launch loads); ``make course`` and ``make lab`` build the rest in the background (:mod:`course_utils.kernel.opbuild`),
and a launch that loads one waits for it. ``python -m course_utils.kernel.opbuild --build`` builds every op still missing
(``--first``: only the first notebooks'); ``status()`` says which can build here, the question ``ds_report``
answers (``python -m course_utils.kernel.ops`` prints it).
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from course_utils.common import devices, paths

paths.use_course_torch_extensions()      # build into (and report on) <venv>/torch_extensions/<device>, where the ranks look


@dataclass(frozen=True)
class Op:
    builder: str                # DeepSpeed's builder class, as its accelerator names it
    name: str                   # the builder's NAME: its folder under TORCH_EXTENSIONS_DIR
    needed_by: str              # for the learner: which launches load it
    notebooks: tuple[str, ...]  # prefixes of the notebooks (and scripts) whose launches load it; "02+": 02 and later;
    #                             () = every one
    seconds: int                # build time on 2 idle cores, the estimate a learner is told: half its compilers' CPU
    #                             time (two files compile at once) and a few seconds of loading (measured 2026-11-25)
    device: str = "cpu"         # the ranks that load it: CPU ranks, or GPU ranks (a CUDA build); each has its own folder
    cpu_seconds: int = 0        # its compilers' CPU time in one fresh `make course` run (the ops' figures of one run
    #                             agree with each other; a run scales them, opbuild.cpu_needed); 0: unknown, counted
    #                             as twice ``seconds``

    @property
    def key(self) -> str:
        """The op's name among the course's ops: its ``name``, with ``-cuda`` for a CUDA build (a GPU machine has both
        builds of fused_adam and cpu_adam)."""
        return self.name if self.device == "cpu" else f"{self.name}-{self.device}"


SHM = Op("ShareMemCommBuilder", "deepspeed_shm_comm", "every launch on CPU ranks (DeepSpeed's CPU all-reduce)", (), 30,
         cpu_seconds=45)
FUSED_ADAM = Op("FusedAdamBuilder", "fused_adam", "notebook 02 and later (DeepSpeed's Adam)", ("02+",), 55,
                cpu_seconds=77)
CPU_ADAM = Op("CPUAdamBuilder", "cpu_adam", "notebooks 04, 07, 08, 10, 12 and 16 (ZeRO-Offload)",
             ("04", "07", "08", "10", "12", "16"), 55, cpu_seconds=93)
# async_io: fresh runs needed 485, 507 and 562 s of CPU on 2026-11-30, 323 and 357 s on 2026-12-01, where fused_adam
# and cpu_adam needed 75 and 72, 96 and 87 s: a compile's CPU seconds vary with the hour as much as its wall time. So
# the table holds one run's figures, and a background build scales them by what the ops it built before needed
# (opbuild.cpu_needed): with 562 for async_io, a notebook waiting for its last files was told "about 8 min" and
# waited 70 s.
ASYNC_IO = Op("AsyncIOBuilder", "async_io", "notebooks 04 and 16 (NVMe offload)", ("04", "16"), 185,   # with pin_memory
              cpu_seconds=360)

# A background build shares the 2 cores with the two notebooks running meanwhile (each launching 2 ranks): its two
# compilers get a third to two thirds of the machine, by what the notebooks beside do. Fresh `make course` runs on 2
# cores built fused_adam, cpu_adam and async_io (55, 55 and 185 s idle) in 75, 139 and 549 s beside the notebooks in
# one run, and all three in about 18 minutes in another: until its first op tells the real pace
# (:class:`course_utils.kernel.opbuild.Pace`), it counts on 2.5 times the idle estimate, and a launch waiting for an op
# asks the pace its compilers get (:func:`course_utils.kernel.opbuild.compilers_cpu`).
BESIDE_NOTEBOOKS = 2.5
# ... and the notebooks beside it run slower by about the share the compilers take (2 of 6 busy processes).
NOTEBOOKS_BESIDE_BUILD = 1.5

# In build order when nothing says which notebooks come first (:func:`build_order` orders by the run's queue): what the
# earliest notebooks load first; cpu_adam before async_io, since four notebooks after 04 wait for cpu_adam alone, while
# async_io serves 04 and 16 only (a run that built async_io first kept 07 waiting almost 6 minutes for a one-minute
# build).
# A GPU machine's GPU ranks load CUDA builds and talk over NCCL (no shm op); its CPU ranks (the launches that need more
# ranks than it has GPUs) load the CPU builds, kept in a folder of their own.
ALL_OPS = (SHM, FUSED_ADAM, CPU_ADAM, ASYNC_IO)
CUDA_OPS = (replace(FUSED_ADAM, device="cuda"), replace(ASYNC_IO, device="cuda"),    # 03 offloads on one GPU too
            replace(CPU_ADAM, device="cuda", needed_by="notebooks 03, 04, 07, 08, 10, 12 and 16 (ZeRO-Offload)",
                    notebooks=("03",) + CPU_ADAM.notebooks))
CPU_RANK_OPS = (SHM, FUSED_ADAM, CPU_ADAM)      # the 2- and 4-rank lessons' CPU ranks on a machine with fewer GPUs
COURSE_OPS = {"cpu": ALL_OPS, "cuda": (SHM,) + CUDA_OPS + CPU_RANK_OPS[1:]}
FIRST_NOTEBOOKS = ("00", "01")    # a fresh `make course` starts with these: set-up builds what they load


def course_ops(device: str | None = None) -> tuple[Op, ...]:
    """The ops of this machine's launches (asked without importing DeepSpeed; without even torch where no NVIDIA driver
    is loaded, so ``make course`` starts its first notebooks a few seconds sooner): :func:`devices.device`."""
    return COURSE_OPS.get(device or devices.device(), COURSE_OPS["cpu"])


def by_key(key: str) -> Op | None:
    return next((op for ops in COURSE_OPS.values() for op in ops if op.key == key), None)


def for_script(stem: str, ops: tuple[Op, ...] | None = None) -> list[Op]:
    """The ops a launch of ``stem`` (a notebook or script name) may load: by its ``NN_`` prefix, else all of them."""
    ops = course_ops() if ops is None else ops
    m = re.match(r"(\d\d)_", stem)

    def loads(op: Op) -> bool:
        return not m or not op.notebooks or any(m[1] == p or (p.endswith("+") and m[1] >= p[:-1]) for p in op.notebooks)
    return [op for op in ops if loads(op)]


def first_ops(ops: tuple[Op, ...] | None = None) -> list[Op]:
    """The ops the first notebooks of a fresh run load: built at set-up, before any notebook starts."""
    ops = course_ops() if ops is None else ops
    return [op for op in ops if any(op in for_script(f"{nb}_", ops) for nb in FIRST_NOTEBOOKS)]


def build_order(todo: list[Op], queue: list[str]) -> list[Op]:
    """``todo`` in the order the notebooks of ``queue`` (their stems, in the order they will start) need them: an op
    whose first notebook comes sooner first; of two first needed by the same notebook, the one more of the following
    notebooks need (they wait for it alone), then the shorter build. Ops no queued notebook loads come last."""
    later = len(queue)

    def key(op: Op) -> tuple:
        users = [i for i, stem in enumerate(queue) if op in for_script(stem, tuple(todo))] or [later]
        return users[0], -len(users), op.seconds
    return sorted(todo, key=key)


def extensions_dir(device: str | None = None) -> Path:
    """Where the ops of ``device``'s ranks are built: ``TORCH_EXTENSIONS_DIR`` for this process's own device, the
    course's folder for the other one (a GPU machine's CPU ranks, :func:`paths.torch_extensions_dir`)."""
    here = devices.device()
    if device is None or device == here:
        return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or paths.torch_extensions_dir(here))
    return paths.torch_extensions_dir(device)


def folder(op: Op) -> Path:
    return extensions_dir(op.device) / op.name


def is_built(op: Op) -> bool:
    """Whether ``op``'s library is in its build folder and no build of it is under way (its lock file)."""
    return (folder(op) / f"{op.name}.so").exists() and not (folder(op) / "lock").exists()


def _lock_age_and_holder(op: Op) -> tuple[float, bool] | None:
    """(seconds since ``op``'s build lock was taken, whether a compiler works in its folder), or None without a lock."""
    lock = folder(op) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
        here = str(folder(op).resolve())
    except OSError:
        return None
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/cwd") == here:
                return age, True
        except OSError:
            pass
    return age, False


def stale_lock(op: Op, settle: float = 5.0) -> Path | None:
    """``op``'s build lock when no build holds it, else None. torch's JIT loader creates ``<op>/lock`` before it compiles
    and removes it after (``torch.utils.file_baton.FileBaton``); a process killed meanwhile (a launch stopped while a
    rank built the op) leaves it, and every later build or load of the op waits for it without end. While a build
    runs, its compilers work in the op's folder (ninja's working directory, ``_run_ninja_build``), which they enter
    within a second or two of taking the lock: a lock older than ``settle`` seconds with no process working there is a
    leftover. A younger one with nobody working there is looked at again once it is ``settle`` seconds old."""
    seen = _lock_age_and_holder(op)
    if seen is not None and not seen[1] and seen[0] < settle:
        time.sleep(settle - seen[0])
        seen = _lock_age_and_holder(op)
    return folder(op) / "lock" if seen is not None and not seen[1] and seen[0] >= settle else None


def clear_stale_locks(ops: tuple[Op, ...] | list[Op] | None = None) -> list[str]:
    """Remove the leftover build locks of ``ops`` (:func:`stale_lock`), saying so; the keys of the ops cleared."""
    cleared = []
    for op in course_ops() if ops is None else ops:
        lock = stale_lock(op)
        if lock is not None:
            lock.unlink(missing_ok=True)
            cleared.append(op.key)
            print(f"Removed the build lock of DeepSpeed's {op.key} op that a process killed while compiling it left "
                  f"behind (nothing was building it): the op builds again when next needed.", flush=True)
    return cleared


def missing(ops: tuple[Op, ...] | list[Op] | None = None) -> list[Op]:
    return [op for op in (course_ops() if ops is None else ops) if not is_built(op)]


def _builder(name: str):
    from course_utils.kernel import hardware
    hardware.detect()     # sets DS_ACCELERATOR on a CPU machine first: no "Setting accelerator to CPU" warning
    from deepspeed.accelerator import get_accelerator
    return get_accelerator().create_op_builder(name)


def status() -> dict[str, bool]:
    """op → whether it can build on this machine (compiler, headers and libraries present); a GPU machine's CPU-rank
    builds are asked in a process of their own, as CPU ranks see the machine."""
    return {op.key: can_build(op) for op in course_ops()}


def can_build(op: Op) -> bool:
    """Whether ``op`` can build on this machine, asked as its ranks see the machine (:func:`_elsewhere`)."""
    if op.device != devices.device():
        return _elsewhere(op, "status") == "can build"
    b = _builder(op.builder)
    return bool(b is not None and b.is_compatible(verbose=False))


def build_one(op: Op) -> str:
    """Build (or load, when built) one op: "built", "skipped" (cannot build here) or "failed". In this process, or, for
    the CPU ranks of a GPU machine, in one that has their environment (DeepSpeed picks its accelerator per process)."""
    if op.device != devices.device():
        return _elsewhere(op, "build")
    clear_stale_locks([op])
    b = _builder(op.builder)
    if b is None or not b.is_compatible(verbose=False):
        return "skipped"
    try:
        b.load(verbose=False)
    except Exception as e:  # the error is in the log; a launch that loads the op meets it again, with DeepSpeed's words
        print(f"{op.name}: build failed: {e}", file=sys.stderr, flush=True)
        return "failed"
    return "built"


def _elsewhere(op: Op, what: str) -> str:
    """``what`` ("build" or "status") for ``op`` in a Python process with the environment of ``op.device``'s ranks on
    this machine (:func:`course_utils.kernel.hardware.cpu_ranks_env`); its last line of output is the answer."""
    import subprocess
    from course_utils.kernel import hardware

    env = {**os.environ, **hardware.cpu_ranks_env(1, gpu_machine=True)}
    env.pop(devices.MACHINE_ENV, None)
    done = subprocess.run([sys.executable, "-m", "course_utils.kernel.ops", what, op.key], env=env, cwd=paths.ROOT,
                          stdout=subprocess.PIPE, text=True)
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if lines else "failed"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OP_LINE = re.compile(r"^(\w+)\s*\.*\s*\[(YES|NO)\]\s*\.+\s*\[(OKAY|NO)\]")


def ds_report_table(report_text: str) -> list[dict]:
    """The op table of ``ds_report``'s output: op, pre-installed in the wheel, can JIT-build here, built already."""
    from torch.utils.cpp_extension import _get_build_directory

    rows = []
    for line in _ANSI.sub("", report_text).splitlines():
        m = _OP_LINE.match(line.strip())
        if m:
            op = m.group(1)
            # torch's build folder for ``op`` without making it: _get_build_directory creates the folder it names,
            # so it is asked for the root (name "", which exists) and the op's folder is looked at, not made
            built = (Path(_get_build_directory("", verbose=False)) / op).glob("*.so")
            rows.append({"op": op, "installed": m.group(2) == "YES", "compatible": m.group(3) == "OKAY",
                         "built_in_cache": any(True for _ in built)})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in ("build", "status"):       # one op, for a process of another device (_elsewhere)
        op = by_key(argv[1])
        if op is None:
            print(f"no op {argv[1]!r}; the course's: {', '.join(o.key for ops in COURSE_OPS.values() for o in ops)}")
            return 2
        if argv[0] == "build":
            print(build_one(op))
        else:
            print("can build" if can_build(op) else "cannot build here")
        return 0
    for op, ok in status().items():
        print(f"{op:24s} {'can build' if ok else 'cannot build here'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
