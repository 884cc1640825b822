"""What every notebook does at its top and for its figures.

``nb = course_utils.start("03_zero_stages")`` prints the hardware line and returns an object whose
``record(...)`` writes the notebook's key figures to ``build/metrics/03_zero_stages.json``: the file
the tests assert on and ``make course`` gathers into ``build/report.md``.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from course_utils.kernel import hardware
from course_utils.common import paths
from course_utils.common.record import plain


class Notebook:
    def __init__(self, name: str):
        self.name = name
        self.hardware = hardware.detect()

    @property
    def metrics_path(self) -> Path:
        return paths.metrics_dir() / f"{self.name}.json"

    def record(self, **figures: Any) -> None:
        """Merge figures into this notebook's metrics file (build/metrics/<notebook>.json), quietly: the figures are
        on the page already; the file serves the tests and ``build/report.md``."""
        path = self.metrics_path
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data.update(plain(figures))
        path.write_text(json.dumps(data, indent=2, sort_keys=True))

    def metrics(self) -> dict:
        return json.loads(self.metrics_path.read_text()) if self.metrics_path.exists() else {}


def quiet_progress_bars() -> None:
    """Library progress bars off in this kernel (and so in the ranks it launches), by each library's own switch;
    also in a library already imported, which read its switch at import."""
    import os
    import sys

    from course_utils.kernel.launch.environment import QUIET_ENV

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    if "tqdm" in sys.modules and not getattr(sys.modules["tqdm"].std.tqdm, "_course_quiet", False):
        from functools import partialmethod     # tqdm read TQDM_DISABLE when it was imported: the same default now
        bar = sys.modules["tqdm"].std.tqdm
        bar.__init__, bar._course_quiet = partialmethod(bar.__init__, disable=True), True


class _Chatter(logging.Filter):
    """DeepSpeed's log lines in the kernel that the runner's filter also keeps out of a launch's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        from course_utils.kernel.launch.streams import CHATTER

        return not any(rule.search(record.getMessage()) for rule in CHATTER)


def quiet_deepspeed_chatter() -> None:
    """DeepSpeed's logger (the same object before and after ``import deepspeed``) leaves out the runner's chatter."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _Chatter) for f in logger.filters):
        logger.addFilter(_Chatter())


def whole_table_cells() -> None:
    """Tables show every cell whole: pandas cuts a cell's text at 50 characters (``display.max_colwidth``) and a list
    in a cell at 100 items (``display.max_seq_items``) and a table at 20 columns (``display.max_columns``), which would hide a config key or a curve an exercise is about."""
    import pandas as pd

    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_seq_items", None)
    pd.set_option("display.max_columns", None)


def start(name: str, fresh: bool = True) -> Notebook:
    """Begin notebook ``name``: print what this machine will run and (by default) clear its old figures."""
    whole_table_cells()
    quiet_progress_bars()
    quiet_deepspeed_chatter()
    nb = Notebook(name)
    if fresh and nb.metrics_path.exists():
        nb.metrics_path.unlink()
    print(nb.hardware.line())
    return nb
