"""The environment every rank of a launch starts with.

The ranks find their run folder (``COURSE_RUN_DIR``: records, failure reports), load the rank hook
that reports which rank died first (``sitecustomize`` on ``PYTHONPATH``), import ``course_utils``
from this checkout, and on a CPU machine share the cores instead of each rank spinning on all of them.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from .. import hardware, paths

RANK_HOOK = Path(__file__).resolve().parent.parent / "rank_hook"   # holds the ranks' sitecustomize.py


def rank_environment(run_dir: Path, world_size: int, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """This process's environment plus what the ranks need; ``extra`` (the caller's ``env=``) wins."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"                  # rank output reaches the log as it is printed
    env["COURSE_RUN_DIR"] = str(run_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RANK_HOOK), str(paths.ROOT), env.get("PYTHONPATH")) if p)
    if not hardware.detect().is_gpu:     # share the cores instead of every rank spinning on all of them
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env
