"""Helpers of the DeepSpeed hands-on course, in four rooms that say where their code runs.

- :mod:`course_utils.rank` — inside the ranks: what ``scripts/*.py`` import once the launcher has started
  them (script scaffolding, rank identity and collectives, engines, memory probes, models, data, the
  Trainer on ranks); :file:`rank/hook/sitecustomize.py` is loaded by every rank's interpreter.
- :mod:`course_utils.common` — shared by both sides, light to import: the checkout's paths, the run
  folder, records and their declarations, the ZeRO rules, the process reaper.
- :mod:`course_utils.kernel` — in the notebook kernel: the launcher runner (:mod:`~course_utils.kernel.launch`),
  config checks, exercise checks, :func:`start`, hardware detection, planning, the ops, the views
  (tables and plots per topic). Ranks never import it.
- :mod:`course_utils.tooling` — around the notebooks: ``make course``, the manifest, the student
  edition, nbgrader and the workshop server, the preflight, the config reference.

A notebook writes ``from course_utils import launch, checks``: the names below are the kernel's modules
(and :func:`start`), imported on first use. Importing this package imports nothing else and changes nothing.
"""
import importlib as _importlib

_MODULES = {
    "launch": "kernel.launch", "checks": "kernel.checks", "checkpoints": "kernel.checkpoints",
    "compare": "kernel.compare", "configs": "kernel.configs", "hardware": "kernel.hardware",
    "notebook": "kernel.notebook", "ops": "kernel.ops", "planning": "kernel.planning", "views": "kernel.views",
    "paths": "common.paths", "rank": "rank",
    "catchup": "tooling.catchup", "workshop": "tooling.workshop",
}
_FROM_NOTEBOOK = {"start", "Notebook"}

__all__ = sorted(_MODULES.keys() | _FROM_NOTEBOOK)


def __getattr__(name: str):
    if name in _MODULES:
        return _importlib.import_module(f"{__name__}.{_MODULES[name]}")
    if name in _FROM_NOTEBOOK:
        return getattr(_importlib.import_module(f"{__name__}.kernel.notebook"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
