"""Small pieces every script of the course needs, so scripts show only what they teach: the command
line, the DeepSpeed config, a learner's exercise file, seeds, rank-0 printing and a clean exit."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
from pathlib import Path
from typing import Any, Callable

from course_utils.common import run_folder


def parse_args(parser: argparse.ArgumentParser | None = None, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the script's own options plus what the launcher adds (``--local_rank``) and the
    DeepSpeed config options (``--deepspeed_config`` / ``--deepspeed``)."""
    import deepspeed

    parser = parser or argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args(argv)


def read_config(path: str | Path) -> dict:
    """A DeepSpeed JSON config file as a dict (the notebook checked it before the launch)."""
    return json.loads(Path(path).read_text())


def load_config(args: argparse.Namespace) -> dict:
    """The config the script was started with (``--deepspeed_config``), as a dict."""
    if not getattr(args, "deepspeed_config", None):
        raise SystemExit("This script needs a DeepSpeed config: add --deepspeed_config configs/<name>.json")
    return read_config(args.deepspeed_config)


def load_exercise(path: str | Path, names: list[str] | tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """The functions ``names`` that a learner's exercise file defines (``checks.export_function`` wrote
    it from the notebook), as ``{name: function}``; names the file does not define are left out."""
    spec = importlib.util.spec_from_file_location(f"exercise_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"No Python file at {path}: export the exercise function from the notebook first")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in names if hasattr(module, name)}


def seed_everything(seed: int) -> None:
    """The same seed for Python, NumPy and torch on every rank (so runs repeat exactly)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def scratch_dir(prefix: str = "scratch-") -> str:
    """A new empty folder for files nobody reads afterwards (a Trainer's ``output_dir``, say): inside the
    launch's run folder under the course's runner, else a temporary folder removed when the rank exits."""
    import atexit
    import shutil
    import tempfile

    run_dir = run_folder.current()
    if run_dir:
        run_folder.scratch(run_dir).mkdir(parents=True, exist_ok=True)
        return tempfile.mkdtemp(prefix=prefix, dir=run_folder.scratch(run_dir))
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def rank0_print(*args, **kwargs) -> None:
    """Print only on global rank 0 (other ranks' lines are in their own logs)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)


def finish() -> None:
    """End a rank cleanly: wait for every rank, tear the process group down, and leave.

    Every rank's results are written before the barrier, so once it returns the work is complete.
    The process then ends with ``os._exit(0)`` instead of a normal interpreter shutdown: objects
    that DeepSpeed still holds (engines, ZeRO's process groups) would otherwise be destroyed
    during finalization, and gloo's worker threads occasionally abort there ("terminate called
    without an active exception"), failing a launch whose work had finished. ``atexit``
    handlers, logging and the standard streams are flushed first, so nothing is lost.

    Under the course's runner it then leaves a mark in the run folder (:func:`course_utils.common.run_folder.end_rank`),
    so the runner can end the launch as soon as every rank has finished rather than wait for the launcher's
    own once-a-second polling and shutdown.
    """
    import atexit
    import logging

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    logging.shutdown()
    run_folder.end_rank(0)
