"""Helpers of the DeepSpeed hands-on course, in two sides along the process boundary.

- :mod:`course_utils.rank` — what the launched ranks (``scripts/*.py``) import: recording, script
  scaffolding, rank identity and collectives, engine helpers, memory probes, models, data, the Trainer
  on ranks, and the pure rules both sides share (:mod:`course_utils.rank.zero_rules`).
- the notebook side — :mod:`~course_utils.launch` (the runner), :mod:`~course_utils.configs` (config
  checks), :mod:`~course_utils.checks` (exercise checks), :mod:`~course_utils.notebook` (:func:`start`),
  :mod:`~course_utils.hardware`, :mod:`~course_utils.planning`, :mod:`~course_utils.views` (tables and
  plots per topic), :mod:`~course_utils.scripts` (the scripts' record declarations). Ranks never import it.
- :mod:`course_utils.paths` (standard library only) serves both.

Importing this package imports nothing else and changes nothing: ``cu.checks``, ``cu.start`` … are
imported on first use.
"""
import importlib as _importlib

_SUBMODULES = {"catchup", "checks", "checkpoints", "compare", "configs", "course", "hardware", "launch", "nbtools",
               "notebook", "ops", "paths", "planning", "preflight", "rank", "scripts", "student", "views", "workshop"}
_FROM_NOTEBOOK = {"start", "Notebook"}

__all__ = sorted(_SUBMODULES | _FROM_NOTEBOOK)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    if name in _FROM_NOTEBOOK:
        return getattr(_importlib.import_module(f"{__name__}.notebook"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
