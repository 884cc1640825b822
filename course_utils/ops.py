"""DeepSpeed's JIT-built ops that the course uses, built once at setup so no notebook stalls on a build.

``python -m course_utils.ops --build`` builds them (in parallel); ``status()`` says which can build here,
the same question ``ds_report`` answers.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from . import paths

paths.use_course_torch_extensions()      # build into (and report on) <venv>/torch_extensions, where the ranks look

# Builder class names as DeepSpeed's accelerator knows them; which ones matter depends on the machine.
COURSE_OPS = {
    "cpu": ["ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder", "AsyncIOBuilder"],
    "cuda": ["CPUAdamBuilder", "AsyncIOBuilder", "FusedAdamBuilder"],
}


def _builder(name: str):
    from deepspeed.accelerator import get_accelerator
    return get_accelerator().create_op_builder(name)


def status() -> dict[str, bool]:
    """op name → whether it can build on this machine (compiler, headers and libraries present)."""
    from deepspeed.accelerator import get_accelerator
    out = {}
    for name in COURSE_OPS.get(get_accelerator().device_name(), COURSE_OPS["cpu"]):
        b = _builder(name)
        out[b.name if b is not None else name] = bool(b is not None and b.is_compatible(verbose=False))
    return out


def _build_one(name: str) -> None:
    b = _builder(name)
    if b is None or not b.is_compatible(verbose=False):
        print(f"skip {name}: cannot build on this machine (see ds_report)")
        return
    t = time.time()
    b.load(verbose=False)
    print(f"built {b.name} in {time.time() - t:.0f} s")


def build_all() -> int:
    from deepspeed.accelerator import get_accelerator
    names = COURSE_OPS.get(get_accelerator().device_name(), COURSE_OPS["cpu"])
    print(f"Building DeepSpeed ops used by the course: {', '.join(names)} (first time only, about a minute each)")
    workers = [subprocess.Popen([sys.executable, "-m", "course_utils.ops", "--one", n]) for n in names]
    return max(w.wait() for w in workers)


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--one")
    a = parser.parse_args()
    if a.one:
        _build_one(a.one)
    elif a.build:
        sys.exit(build_all())
    else:
        for op, ok in status().items():
            print(f"{op:24s} {'can build' if ok else 'cannot build here'}")
