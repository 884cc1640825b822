"""The course's Jupyter kernel: IPython's kernel (ipykernel's own ``launch_new_instance``) whose process, once the
kernel has shut down and every exit handler has run, ends without the interpreter's teardown.

The teardown is what a notebook's kernel spends most of its shutdown on: with torch, DeepSpeed, transformers,
pandas and matplotlib loaded, clearing the modules and collecting what they hold took 1.8–2.6 s after the last cell
of the notebooks here, against 0.4–0.5 s without it, at the end of every notebook of ``make course`` and ``make test``.
Nothing is lost by skipping it: the course's clean-up (launches, cgroups, a Slurm cluster, temporary folders) runs in
exit handlers and ``weakref.finalize`` callbacks, which Python runs before this one — it is registered first, so it
runs last — and every file still open for writing is flushed first, as the teardown would
(:func:`course_utils.common.ending.flush_open_files`, which the ranks' hook uses to end a rank the same way).

The kernelspec (``make setup``'s kernel step) starts this module instead of ``ipykernel_launcher``:
``python -m course_utils.kernel.kernel_main --install NAME`` rewrites an installed kernelspec's command so.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

LAUNCHER = "ipykernel_launcher"
MODULE = "course_utils.kernel.kernel_main"
_status = {"code": 0}        # the exit status the interpreter would have given


def _end_without_teardown() -> None:
    from course_utils.common.ending import flush_open_files

    flush_open_files()
    os._exit(_status["code"])


def main() -> None:
    atexit.register(_end_without_teardown)        # the first exit handler, so the last to run
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]                           # as ipykernel_launcher does: IPython puts it back
    from ipykernel import kernelapp

    try:
        kernelapp.launch_new_instance()
    except SystemExit as e:
        _status["code"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    except BaseException:
        _status["code"] = 1
        raise


def install(name: str) -> Path:
    """Make the installed kernelspec ``name`` start this module (its ``-m ipykernel_launcher`` replaced); returns
    its kernel.json. Raises LookupError when no such kernelspec is installed, ValueError when its command is not
    ipykernel's."""
    from jupyter_client.kernelspec import KernelSpecManager

    folder = KernelSpecManager().find_kernel_specs().get(name)
    if folder is None:
        raise LookupError(f"no kernelspec {name!r}: install it first (python -m ipykernel install --name {name})")
    spec_file = Path(folder) / "kernel.json"
    spec = json.loads(spec_file.read_text())
    argv = spec["argv"]
    if MODULE not in argv:
        if LAUNCHER not in argv:
            raise ValueError(f"{spec_file}: the command {argv} does not start {LAUNCHER}")
        argv[argv.index(LAUNCHER)] = MODULE
        spec_file.write_text(json.dumps(spec, indent=1) + "\n")
    return spec_file


def starts_course_kernel(name: str) -> bool:
    """Whether the installed kernelspec ``name`` starts this module."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return MODULE in KernelSpecManager().get_kernel_spec(name).argv
    except NoSuchKernel:
        return False


if __name__ == "__main__":
    if sys.argv[1:2] == ["--install"] and len(sys.argv) == 3:
        print(f"{install(sys.argv[2])} starts {MODULE}")
    else:
        main()
