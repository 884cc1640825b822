"""The course's scripts as modules, for the tests that call a script's functions directly. The notebook kernel never
does this: what it needs of a script (its records, its command line) lives in ``course_utils/common/records/``.

Importing a script runs nothing: every script does its work in ``main()``.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from types import ModuleType

from course_utils.common import paths
from course_utils.kernel import hardware


@functools.lru_cache(maxsize=None)
def load_script(name: str) -> ModuleType:
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
