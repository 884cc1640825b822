"""Where the course keeps things: the repository folders and the build outputs.

Everything a run writes goes under ``build/`` (or ``$COURSE_BUILD_DIR`` when set, as the tests do),
so a learner always knows where to look and ``make clean`` removes it all.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("COURSE_ROOT") or Path(__file__).resolve().parents[2])
CONFIGS = ROOT / "configs"
SCRIPTS = ROOT / "scripts"
NOTEBOOKS = ROOT / "notebooks"


def build_dir() -> Path:
    """The build folder: ``$COURSE_BUILD_DIR`` or ``<repo>/build``."""
    return Path(os.environ.get("COURSE_BUILD_DIR") or ROOT / "build")


def runs_dir() -> Path:
    """One sub-folder per launch: its config, full log, per-rank logs and recorded metrics."""
    return build_dir() / "runs"


def metrics_dir() -> Path:
    """One JSON file per notebook with the figures that notebook measured."""
    return build_dir() / "metrics"


def data_dir() -> Path:
    """Generated data sets and locally trained tokenizers, cached between runs."""
    return build_dir() / "data"


def reference_dir() -> Path:
    """Evidence of the course on real GPUs, committed: one folder per ``make gpu-check`` run, ``<date>-<gpu>/``
    (what each file is: ``reference/gpu/README.md``)."""
    return ROOT / "reference" / "gpu"


def relative(path: Path | str) -> str:
    """``path`` relative to the repository root when it lies inside it (for commands shown to learners)."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def torch_extensions_dir(device: str | None = None) -> Path:
    """Where DeepSpeed's JIT-built ops (cpu_adam, async_io, shm comm) are cached: ``<venv>/torch_extensions/<device>``,
    so two clones or virtual environments never rebuild over each other's builds, and on a GPU machine the CPU
    ranks' builds (``cpu``) never overwrite the CUDA builds of the same name (``cuda``). ``device``: this process's
    (:func:`course_utils.common.devices.device`) when not given."""
    if device is None:
        from course_utils.common import devices
        device = devices.device()
    return Path(sys.prefix) / "torch_extensions" / device


def use_course_torch_extensions() -> None:
    """Default ``TORCH_EXTENSIONS_DIR`` to :func:`torch_extensions_dir` (a value already set wins)."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        os.environ["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir())
