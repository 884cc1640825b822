"""Helpers of the DeepSpeed hands-on course.

Notebooks import this package and stay thin: :mod:`course_utils.launch` runs the real ``deepspeed``
launcher, :mod:`course_utils.configs` checks DeepSpeed configs, :mod:`course_utils.checks` checks
exercises, and :func:`start` opens a notebook and records its figures.
"""
import os as _os
import sys as _sys

# DeepSpeed's JIT-built ops (cpu_adam, async_io, shm comm) are cached per environment, so two clones or
# virtual environments never rebuild over each other's builds. Ranks inherit it from the environment.
_os.environ.setdefault("TORCH_EXTENSIONS_DIR", _os.path.join(_sys.prefix, "torch_extensions"))

from . import checks, configs, hardware, launch, paths
from .notebook import Notebook, start
from .record import record

__all__ = ["checks", "configs", "hardware", "launch", "paths", "record", "start", "Notebook"]
