"""Notebook 00: what a learner meets when DeepSpeed has to build an op on a machine without a C++ compiler.

:func:`try_without_compiler` starts one Python process (through :func:`course_utils.kernel.launch.command`) whose
``PATH`` holds ninja and nothing else, so no ``c++`` can be found, and whose ``TORCH_EXTENSIONS_DIR`` is a temporary
folder removed afterwards: the course's own builds are never touched. In it (:func:`main`):

1. ``ds_report``'s op rows (``deepspeed/env_report.py``, ``op_report``: each builder's ``is_compatible``);
2. ``deepspeed.init_distributed()`` as a one-rank job, which on DeepSpeed's CPU accelerator first loads the
   shared-memory all-reduce op (``deepspeed/comm/torch.py``, ``build_shm_op``): the JIT build of
   ``deepspeed_shm_comm`` fails (``OpBuilder.jit_load`` → torch's ``cpp_extension.load`` → ninja);
3. the compiler back on ``PATH`` (the fix): torch finds ``c++`` (``check_compiler_ok_for_platform``) and
   async_io's test program compiles and links again (``AsyncIOBuilder.is_compatible``, via ``has_function``).
Nothing is built: a build takes half a minute, and the course's builds of these ops are made at set-up.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

RESULT = "NO-COMPILER-RESULT "      # the child's last line: this prefix, then its findings as JSON
WITH_COMPILER = "COURSE_PATH_WITH_COMPILER"   # the child's PATH for step 3


@dataclass
class NoCompiler:
    """What the process without a compiler saw (see the module's docstring)."""
    compatible: dict            # ds_report's "compatible" column without a compiler: {op: True/False}
    report_warnings: list       # ds_report's [WARNING] lines without a compiler
    error_type: str             # the exception init_distributed raised
    error_first_line: str       # its message's first line, as the traceback's last line starts
    not_found: list             # the build log's lines that name the missing program ("...: c++: not found")
    torch_warning: str          # what torch printed before the build (its compiler check), first sentence
    error_frames: list          # DeepSpeed's and torch's files and functions the error came through
    compiler_found_after: bool  # with the compiler on PATH again: torch accepts it
    async_io_after: bool        # ... and async_io's test program compiles and links (ds_report's row)
    output: str                 # everything the process printed


def try_without_compiler(timeout: float = 120) -> NoCompiler:
    """Run :func:`main` in a process that cannot find a C++ compiler; the temporary folder is gone afterwards."""
    from course_utils.kernel.launch import command

    ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
    with tempfile.TemporaryDirectory(prefix="no-compiler-") as scratch:
        tools = Path(scratch) / "bin"
        tools.mkdir()
        (tools / "ninja").symlink_to(ninja)       # torch checks for ninja before it compiles anything
        env = {"PATH": str(tools), "TORCH_EXTENSIONS_DIR": str(Path(scratch) / "extensions"), "DS_ACCELERATOR": "cpu",
               WITH_COMPILER: os.environ.get("PATH", ""), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1"}
        out = command([sys.executable, "-m", "course_utils.kernel.no_compiler"], timeout=timeout, env=env)
    found = [line for line in out.splitlines() if line.startswith(RESULT)]
    if not found:
        raise RuntimeError(f"the process without a compiler reported nothing; it printed:\n{out[-2000:]}")
    warned = next((line for line in out.splitlines() if "Your compiler" in line), "")   # torch's logger, on stderr
    warned = warned[warned.find("Your compiler"):].split(". ")[0] if warned else ""
    return NoCompiler(**json.loads(found[-1][len(RESULT):]), torch_warning=warned, output=out)


def main() -> None:
    """The child process (environment set by :func:`try_without_compiler`)."""
    import contextlib
    import io
    import traceback

    import deepspeed
    from deepspeed import env_report
    from course_utils.kernel import ops

    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        env_report.op_report(verbose=True)                   # what `ds_report` prints about the ops
    rows = ops.ds_report_table(report.getvalue())
    warnings = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in report.getvalue().splitlines()
                if "[WARNING]" in line]

    from course_utils.kernel.launch.commands import free_port
    os.environ["MASTER_PORT"] = str(free_port())
    error = None
    try:
        deepspeed.init_distributed()                         # a one-rank job: it loads the shm op first
    except Exception as exc:                                 # noqa: BLE001 (the learner's error, shown whole)
        error = exc
    if error is None:
        raise SystemExit("init_distributed worked without a compiler: this machine has a build of the op somewhere")
    traceback.print_exception(error)
    text = str(error)
    frames = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}: {f.name}"
              for f in traceback.extract_tb(error.__traceback__) if "site-packages" in f.filename]

    os.environ["PATH"] = os.environ[WITH_COMPILER]           # the fix: a compiler on PATH again
    from deepspeed.ops.op_builder.cpu import AsyncIOBuilder
    from torch.utils.cpp_extension import check_compiler_ok_for_platform, get_cxx_compiler
    print(RESULT + json.dumps({
        "compatible": {r["op"]: r["compatible"] for r in rows}, "report_warnings": warnings,
        "error_type": type(error).__name__, "error_first_line": f"{type(error).__name__}: {text.splitlines()[0]}",
        "not_found": sorted({line.strip() for line in text.splitlines() if line.strip().endswith("not found")}),
        "error_frames": frames,
        "compiler_found_after": check_compiler_ok_for_platform(get_cxx_compiler()),
        "async_io_after": AsyncIOBuilder().is_compatible()}), flush=True)


if __name__ == "__main__":
    main()
