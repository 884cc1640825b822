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
from dataclasses import dataclass
from pathlib import Path

from course_utils.common import paths

paths.use_course_torch_extensions()      # build into (and report on) <venv>/torch_extensions, where the ranks look


@dataclass(frozen=True)
class Op:
    builder: str                # DeepSpeed's builder class, as its accelerator names it
    name: str                   # the builder's NAME: its folder under TORCH_EXTENSIONS_DIR
    needed_by: str              # for the learner: which launches load it
    notebooks: tuple[str, ...]  # prefixes of the notebooks (and scripts) whose launches load it; "02+": 02 and later;
    #                             () = every one
    seconds: int                # build time on 2 idle cores, the estimate a learner is told: half its compilers' CPU
    #                             time (two files compile at once) and a few seconds of loading (measured 2026-11-25)


SHM = Op("ShareMemCommBuilder", "deepspeed_shm_comm", "every launch (DeepSpeed's CPU all-reduce)", (), 30)
FUSED_ADAM = Op("FusedAdamBuilder", "fused_adam", "notebook 02 and later (DeepSpeed's Adam)", ("02+",), 55)
CPU_ADAM = Op("CPUAdamBuilder", "cpu_adam", "notebooks 04, 07, 08 and 10 (ZeRO-Offload)", ("04", "07", "08", "10"), 55)
ASYNC_IO = Op("AsyncIOBuilder", "async_io", "notebook 04 (NVMe offload)", ("04",), 185)   # with pin_memory

# A background build shares the 2 cores with the two notebooks running meanwhile: until its first op tells the real
# pace, it counts on about half the machine.
BESIDE_NOTEBOOKS = 2.0

# In build order: what the earliest notebooks load first; of two first needed by the same notebook, the longer build
# first (async_io before cpu_adam: while it builds, the notebooks that need neither fill both lanes, and 07 and 08 wait
# only for cpu_adam's shorter build). On a GPU the collectives go through NCCL, no shm op.
ALL_OPS = (SHM, FUSED_ADAM, ASYNC_IO, CPU_ADAM)
COURSE_OPS = {"cpu": ALL_OPS, "cuda": (FUSED_ADAM, ASYNC_IO, CPU_ADAM)}
FIRST_NOTEBOOKS = ("00", "01")    # a fresh `make course` starts with these: set-up builds what they load


def course_ops() -> tuple[Op, ...]:
    """The ops of this machine's accelerator (asked of torch, without importing DeepSpeed; without even torch where
    no NVIDIA driver is loaded, so ``make course`` starts its first notebooks a few seconds sooner)."""
    device = os.environ.get("DS_ACCELERATOR")
    if device is None and not Path("/proc/driver/nvidia").exists():
        device = "cpu"
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return COURSE_OPS.get(device, COURSE_OPS["cpu"])


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


def extensions_dir() -> Path:
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or paths.torch_extensions_dir())


def is_built(op: Op) -> bool:
    """Whether ``op``'s library is in the build folder and no build of it is under way (its lock file)."""
    folder = extensions_dir() / op.name
    return (folder / f"{op.name}.so").exists() and not (folder / "lock").exists()


def missing(ops: tuple[Op, ...] | list[Op] | None = None) -> list[Op]:
    return [op for op in (course_ops() if ops is None else ops) if not is_built(op)]


def _builder(name: str):
    from course_utils.kernel import hardware
    hardware.detect()     # sets DS_ACCELERATOR on a CPU machine first: no "Setting accelerator to CPU" warning
    from deepspeed.accelerator import get_accelerator
    return get_accelerator().create_op_builder(name)


def status() -> dict[str, bool]:
    """op name → whether it can build on this machine (compiler, headers and libraries present)."""
    out = {}
    for op in course_ops():
        b = _builder(op.builder)
        out[b.name if b is not None else op.name] = bool(b is not None and b.is_compatible(verbose=False))
    return out


def build_one(op: Op) -> str:
    """Build (or load, when built) one op in this process: "built", "skipped" (cannot build here) or "failed"."""
    b = _builder(op.builder)
    if b is None or not b.is_compatible(verbose=False):
        return "skipped"
    try:
        b.load(verbose=False)
    except Exception as e:  # the error is in the log; a launch that loads the op meets it again, with DeepSpeed's words
        print(f"{op.name}: build failed: {e}" + arch_list_hint(e), file=sys.stderr, flush=True)
        return "failed"
    return "built"


def arch_list_hint(error: Exception, arch_list: str | None = None) -> str:
    """What to change when DeepSpeed's JIT builder could not read ``TORCH_CUDA_ARCH_LIST``: it sorts the entries by
    ``int()`` of each part (``compute_capability_args`` in ``deepspeed/ops/op_builder/builder.py``), so an arch with a
    letter suffix such as ``9.0a`` (set on some Hopper machines) fails with "invalid literal for int()"."""
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "") if arch_list is None else arch_list
    suffixed = [a for a in arch_list.replace(" ", ";").split(";") if a and not a.split("+")[0].replace(".", "").isdigit()]
    if not suffixed or "invalid literal for int()" not in str(error):
        return ""
    plain = ";".join(dict.fromkeys(a.split("+")[0].rstrip("abcdefghijklmnopqrstuvwxyz") for a in arch_list.replace(" ", ";").split(";") if a))
    return (f"\n  TORCH_CUDA_ARCH_LIST={arch_list!r} names {', '.join(suffixed)}: DeepSpeed's JIT builder reads only "
            f"digits there. Set TORCH_CUDA_ARCH_LIST={plain!r} (export it, or in the notebook's environment) and build again.")


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
            built = Path(_get_build_directory(op, verbose=False)).glob("*.so")
            rows.append({"op": op, "installed": m.group(2) == "YES", "compatible": m.group(3) == "OKAY",
                         "built_in_cache": any(True for _ in built)})
    return rows


def main() -> int:
    for op, ok in status().items():
        print(f"{op:24s} {'can build' if ok else 'cannot build here'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
