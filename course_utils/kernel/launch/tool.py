"""Running one single-process tool of the stack (``ds_report``, ``accelerate``, a converter script).

Same guarantees as a launch, at the size of one process: the tool runs in a session of its own, dies
with the kernel, and on a timeout, an error or an interrupt its whole process group is killed and
:class:`CommandError` names the command and shows the end of what it printed.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from course_utils.common import paths
from course_utils.kernel.launch.failures import tail
from course_utils.kernel.launch.processes import die_with_parent, kill_group
from course_utils.kernel.launch.result import CommandError


def command(args: list[Any], timeout: float = 300, cwd: Path | None = None,
            env: Mapping[str, Any] | None = None) -> str:
    """Run ``args`` (the tool from this environment's ``bin/`` when it is there) and return its output.

    Raises :class:`CommandError` (a ``RuntimeError``) on a non-zero exit or after ``timeout`` seconds.
    """
    tool = Path(sys.executable).parent / str(args[0])
    argv = [str(tool) if tool.exists() else str(args[0]), *map(str, args[1:])]
    shown = shlex.join(map(str, args))
    environment = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
    proc = subprocess.Popen(argv, cwd=cwd or paths.ROOT, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
                            preexec_fn=die_with_parent)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group([proc])
        out = _remaining_output(proc)
        raise CommandError(f"`{shown}` timed out after {timeout:g} s and was killed; the end of its output:\n"
                           f"{tail(out) or '(nothing)'}", out) from None
    except BaseException:
        kill_group([proc])
        raise
    if proc.returncode != 0:
        raise CommandError(f"`{shown}` exited with {proc.returncode}:\n{tail(out)}", out)
    return out


def _remaining_output(proc: subprocess.Popen) -> str:
    """What a killed tool printed (communicate keeps what it read before the timeout)."""
    try:
        return proc.communicate(timeout=5)[0] or ""
    except (subprocess.TimeoutExpired, ValueError, OSError):   # a pipe held open by an escaped grandchild
        return ""
