"""Loaded by every rank of a course launch (the runner puts this folder on PYTHONPATH).

It records when and where a rank dies of an uncaught exception, so the runner can name the rank
that failed first rather than a peer that only lost its connection to it afterwards.
"""
import json
import os
import sys
import time
import traceback

_previous_hook = sys.excepthook


def _record_failure(exc_type, exc, tb):
    run_dir = os.environ.get("COURSE_RUN_DIR")
    if run_dir:
        try:
            folder = os.path.join(run_dir, "failures")
            os.makedirs(folder, exist_ok=True)
            rank = os.environ.get("RANK", "?")
            with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
                json.dump({"rank": rank, "time": time.time(), "error": f"{exc_type.__name__}: {exc}",
                           "traceback": "".join(traceback.format_exception(exc_type, exc, tb))}, f)
        except OSError:
            pass
    _previous_hook(exc_type, exc, tb)


sys.excepthook = _record_failure
