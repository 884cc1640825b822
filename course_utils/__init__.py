"""Helpers of the DeepSpeed hands-on course.

Notebooks import this package and stay thin: :mod:`course_utils.launch` runs the real ``deepspeed``
launcher, :mod:`course_utils.configs` checks DeepSpeed configs, :mod:`course_utils.checks` checks
exercises, and :func:`start` opens a notebook and records its figures.
"""
from . import checks, configs, hardware, launch, paths
from .notebook import Notebook, start
from .record import record

__all__ = ["checks", "configs", "hardware", "launch", "paths", "record", "start", "Notebook"]
