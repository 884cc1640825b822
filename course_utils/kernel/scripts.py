"""The scripts the launcher runs, as modules the notebook side can read: each script declares the
records it writes (dataclasses deriving from :class:`course_utils.common.record.Record`), and the
notebook reads a launch's records through those declarations::

    Rung = scripts.load("04_offload_ladder").Rung
    rows = read_as(result.records, Rung)

Importing a script runs nothing: every script does its work in ``main()``.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from types import ModuleType

from course_utils.kernel import hardware
from course_utils.common import paths


@functools.lru_cache(maxsize=None)
def load(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (imported once per process)."""
    stem = name.removesuffix(".py")
    path = paths.SCRIPTS / f"{stem}.py"
    if not path.exists():
        available = ", ".join(sorted(p.stem for p in paths.SCRIPTS.glob("[0-9]*.py")))
        raise FileNotFoundError(f"No script {path.name} in {paths.relative(paths.SCRIPTS)}: the course has {available}")
    hardware.detect()     # before the script imports DeepSpeed: on a CPU it sets DS_ACCELERATOR (no detection warning)
    module_name = f"course_scripts.s{stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module           # dataclasses (and pickle) look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
