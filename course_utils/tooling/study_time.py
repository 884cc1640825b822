"""How long a notebook takes a learner on their own, worked out from the notebook itself: the words of its text, the
lines of its code, its exercises, and its run time in the last full ``make course`` (the manifest's
``full_seconds``). Each notebook's opening box states it ("Time to allow"), and INSTRUCTORS.md's timing table shows it
beside the workshop slot; ``python -m course_utils.tooling.tables --write`` writes the boxes, and
tests/test_manifest.py fails when one drifts.

The rates are planning figures, calibrated on readers who worked through the notebooks alone (read every section and
excerpt, did every exercise): the first read the first 15 notebooks in 14–15 hours; the second read 00–16 in about
22.5 hours, and the notebooks that print the most source excerpts took longest (03 about 130 minutes, 11 about 120,
13 about 100, 15 about 110). Each printed excerpt (of DeepSpeed's, transformers' or the course's own source) is read
against the text around it: :data:`MINUTES_PER_EXCERPT` counts it, which brings those four within about 10 % of that
reader and the seventeen together within about 7 %.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.tooling.nbtools import opening_box_drift

WORDS_PER_MINUTE = 100         # reading the text, its tables and figures
CODE_LINES_PER_MINUTE = 15     # reading the code cells (excerpts of DeepSpeed's source are printed, not counted)
MINUTES_PER_EXERCISE = 10      # one exercise, its launch and a retry included
MINUTES_PER_EXCERPT = 0.75     # one printed source excerpt (a show_source / show_script / show_deepspeed_source call)
EXCERPT_CALL = re.compile(r"\bshow_(?:source|script|script_function|deepspeed_source)\(")
BOX_PREFIX = "> **Time to allow**"
RECORD_TAG = "record"          # a cell that only records the run's figures: its source hidden, not read


def reading_minutes(notebook: Path) -> float:
    """Minutes to read ``notebook``'s markdown (at :data:`WORDS_PER_MINUTE`), code (:data:`CODE_LINES_PER_MINUTE`) and
    the source excerpts its code prints (:data:`MINUTES_PER_EXCERPT` each)."""
    return cells_reading_minutes(nbformat.read(str(notebook), as_version=4).cells)


def cells_reading_minutes(cells: list) -> float:
    """:func:`reading_minutes` of some of a notebook's cells (a route that takes only some sections)."""
    words = sum(len(re.findall(r"\S+", line)) for c in cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if not line.startswith(BOX_PREFIX))   # the time itself: not read
    code = sum(1 for c in cells if c.cell_type == "code" and RECORD_TAG not in c.get("metadata", {}).get("tags", [])
               for line in c.source.splitlines() if line.strip())      # a recording cell is out of sight: not read
    excerpts = sum(len(EXCERPT_CALL.findall(c.source)) for c in cells if c.cell_type == "code")
    return words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE + excerpts * MINUTES_PER_EXCERPT


def is_solution_cell(cell) -> bool:
    """An exercise's cell, as the student edition finds it (what :func:`exercises` counts)."""
    from course_utils.tooling.student import BEGIN

    return cell.cell_type == "code" and BEGIN in cell.source


def exercises(notebook: Path) -> int:
    from course_utils.tooling.student import exercises as solution_cells

    return len(solution_cells(nbformat.read(str(notebook), as_version=4)))


def alone_minutes(notebook: Path, run_seconds: float) -> int:
    """Reading, exercises and the notebook's own run time, rounded up to 5 minutes."""
    return minutes_alone(reading_minutes(notebook), exercises(notebook), run_seconds)


def minutes_alone(reading: float, exercises: int, run_seconds: float) -> int:
    """Reading minutes, exercises and run seconds as a learner's time alone, rounded up to 5 minutes (a whole notebook
    or some of its sections)."""
    return 5 * math.ceil((reading + MINUTES_PER_EXERCISE * exercises + run_seconds / 60) / 5)


def _runs(seconds: float) -> str:
    minutes = seconds / 60
    return f"about {max(1, round(minutes))} min" if minutes >= 1 else "under a minute"


def box_line(notebook: Path) -> str:
    """The "Time to allow" line of the notebook's opening box."""
    from course_utils.tooling import manifest

    seconds = manifest.entry(notebook.stem)["full_seconds"]
    n = exercises(notebook)
    return (f"{BOX_PREFIX} about {alone_minutes(notebook, seconds)} min on your own: "
            f"{5 * math.ceil(reading_minutes(notebook) / 5)} min of reading, {n} exercise{'s' * (n != 1)}, "
            f"{_runs(seconds)} of runs on 2 CPU cores (measured in the last full `make course`).  ")


def with_box_line(source: str, line: str) -> str:
    """The opening cell's ``source`` with its "Time to allow" line (and any line continuing it) replaced."""
    lines = source.split("\n")
    start = next(i for i, old in enumerate(lines) if old.startswith(BOX_PREFIX))
    end = start + 1
    while end < len(lines) and lines[end].startswith("> ") and not lines[end].startswith("> **"):
        end += 1
    return "\n".join(lines[:start] + [line] + lines[end:])


def box_drift(notebooks: Path = paths.NOTEBOOKS, write: bool = False) -> list[str]:
    """The notebooks whose opening box states another time than :func:`box_line` (rewritten with ``write``)."""
    return opening_box_drift(box_line, with_box_line, notebooks, write)
