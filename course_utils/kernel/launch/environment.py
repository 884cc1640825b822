"""The environment every rank of a launch starts with.

The ranks find their run folder (``COURSE_RUN_DIR``: records, failure reports), load the rank hook
that reports which rank died first (``sitecustomize`` on ``PYTHONPATH``), import ``course_utils``
from this checkout, and on a CPU machine share the cores instead of each rank spinning on all of them.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from course_utils.kernel import hardware
from course_utils.common import paths, run_folder

RANK_HOOK = paths.ROOT / "course_utils" / "rank" / "hook"   # holds the ranks' sitecustomize.py
# Progress bars teach nothing in a notebook cell and bury what does (datasets' "Map", transformers' "Loading
# weights" and "Writing model shards", zero_to_fp32's "Loading checkpoint shards"): off at their cause, in the
# kernel (``course_utils.start``) and in every rank. Each variable is the library's own switch.
QUIET_ENV = {"HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def rank_environment(run_dir: Path, world_size: int, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """This process's environment plus what the ranks need; ``extra`` (the caller's ``env=``) wins."""
    env = dict(os.environ)
    for name in ("SSH_CONNECTION", "SSH_CLIENT"):  # the notebook's own ssh session, if any, is not the ranks'
        env.pop(name, None)                        # (ranks started over ssh get theirs from sshd)
    env["PYTHONUNBUFFERED"] = "1"                  # rank output reaches the log as it is printed
    env[run_folder.ENV] = str(run_dir)
    for name, value in QUIET_ENV.items():
        env.setdefault(name, value)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RANK_HOOK), str(paths.ROOT), env.get("PYTHONPATH")) if p)
    hw = hardware.detect()
    if not hw.is_gpu:
        for name, value in hardware.cpu_ranks_env(world_size).items():
            env.setdefault(name, value)
    env.update(hardware.simulation_env(hw, world_size))     # a described GPU machine: its ranks compute on the CPU
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


# A rank started over ssh does not inherit the launcher's environment: sshd gives it a fresh login environment,
# plus what DeepSpeed's pdsh runner exports in the remote command. It exports the variables whose names start
# with ``EXPORT_ENVS`` (PYTHON..., so PYTHONPATH with the rank hook arrives by itself) and its accelerator's
# (NCCL... on CUDA), and every line of ``.deepspeed_env``. The course writes that file with what its ranks need
# besides: the variables the runner or the caller set, and these from the launcher's environment.
ENV_FILE_PREFIXES = ("COURSE_", "DS_", "TORCH_", "OMP_", "MKL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "NCCL_",
                     "GLOO_", "CUDA_")
ENV_FILE_NAMES = ("PATH", "LD_LIBRARY_PATH")
_UNSAFE = set('"$`\\\n\r')       # DeepSpeed puts each value in `export K="v"` of a shell command line


def exported_by_deepspeed() -> tuple[str, ...]:
    """The name prefixes DeepSpeed's multi-node runners export to every node themselves."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.launcher.runner import EXPORT_ENVS

    return tuple(EXPORT_ENVS) + tuple(get_accelerator().export_envs())


def ssh_environment(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The lines of ``.deepspeed_env`` for ranks started over ssh with the environment ``env``: what differs
    from ``base`` (the launcher's environment, ``os.environ`` by default) and the names the course's ranks
    rely on (:data:`ENV_FILE_PREFIXES`, :data:`ENV_FILE_NAMES`), less what DeepSpeed exports itself.

    A value the shell line would expand (``"``, ``$``, a backquote, a backslash, a line break) is left out when it
    was inherited, and refused when the runner or the caller set it.
    """
    base = os.environ if base is None else base
    skip = exported_by_deepspeed()
    chosen = {}
    for key, value in sorted(env.items()):
        changed = base.get(key) != value
        if key.startswith(skip) or not (changed or key in ENV_FILE_NAMES or key.startswith(ENV_FILE_PREFIXES)):
            continue
        if _UNSAFE & set(value):
            if changed:
                raise ValueError(f"{key}={value!r} cannot reach ranks over ssh: DeepSpeed writes it into a shell "
                                 f"command line (export {key}=\"...\"), where {sorted(_UNSAFE & set(value))} "
                                 "would be expanded or end the line")
            continue
        chosen[key] = value
    return chosen


def write_env_file(path: Path, variables: Mapping[str, str]) -> Path:
    """``variables`` as ``NAME=value`` lines, the format DeepSpeed's runner reads from ``.deepspeed_env``
    (one ``=`` split per line: no comments, no blank lines)."""
    path.write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
    return path
