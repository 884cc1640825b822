"""INSTRUCTORS.md's timing table, generated from the report of a full ``make course`` run.

``make course`` writes ``build/report.md`` (each notebook's wall time on this machine) and the table made from
it to ``build/instructors-timing.md``; it never edits a tracked file, so a learner's checkout stays clean.
``make instructors`` (``python -m course_utils.instructors``) copies that run's table between the two markers of
INSTRUCTORS.md, so the committed table is always one a run measured; ``--check`` only says whether it matches.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import nbformat

from . import paths

GUIDE = paths.ROOT / "INSTRUCTORS.md"
BEGIN = "<!-- timing table: written by `make instructors` from build/report.md; do not edit by hand -->"
END = "<!-- end of timing table -->"
READING_MINUTES = 15           # planning figure: reading the sections and discussing them, per notebook
MINUTES_PER_EXERCISE = 10      # planning figure: a participant's time for one exercise, launches included
_ROW = re.compile(r"^\| (\d\d_\w+) \| (ok|FAILED) \| (\d+) s \| (.*) \|$")


def report_rows(report: str) -> list[dict]:
    """The per-notebook rows of a ``make course`` report: name, status, seconds, what ran beside it."""
    rows = []
    for line in report.splitlines():
        m = _ROW.match(line.strip())
        if m:
            rows.append({"notebook": m[1], "ok": m[2] == "ok", "seconds": int(m[3]),
                         "beside": [] if m[4] == "—" else [b.strip() for b in m[4].split(",")]})
    return rows


def exercise_counts(notebooks: Path = paths.NOTEBOOKS) -> dict[str, int]:
    """Exercises per notebook, as the student edition counts them (nbgrader solution cells)."""
    from .student import exercises

    return {nb.stem: len(exercises(nbformat.read(str(nb), as_version=4))) for nb in sorted(notebooks.glob("*.ipynb"))}


def slot_minutes(seconds: int, exercises: int) -> int:
    """A planning slot: reading and discussion, the exercises, and the notebook's own run time, rounded up to
    5 minutes. The first two are planning figures, not measurements."""
    return 5 * math.ceil((READING_MINUTES + MINUTES_PER_EXERCISE * exercises + seconds / 60) / 5)


def timing_table(report: str, counts: dict[str, int] | None = None) -> str:
    """The markdown table of INSTRUCTORS.md from a report (and the exercises per notebook)."""
    counts = exercise_counts() if counts is None else counts
    rows = report_rows(report)
    if not rows:
        raise ValueError("no notebook rows in this report: run `make course` first")
    lines = ["| notebook | runs in (2 cores, measured) | exercises | plan a slot of |", "|---|---|---|---|"]
    for r in rows:
        ran = f"{r['seconds'] // 60} min {r['seconds'] % 60:02d} s" + (" *" if r["beside"] else "")
        if not r["ok"]:
            ran += " (FAILED in that run)"
        n = counts.get(r["notebook"], 0)
        lines.append(f"| {r['notebook']} | {ran} | {n} | {slot_minutes(r['seconds'], n)} min |")
    total = sum(r["seconds"] for r in rows)
    slots = sum(slot_minutes(r["seconds"], counts.get(r["notebook"], 0)) for r in rows)
    lines.append(f"| **all, one after another** | {total // 60} min {total % 60:02d} s | {sum(counts.get(r['notebook'], 0) for r in rows)}"
                 f" | {slots // 60} h {slots % 60:02d} min |")
    lines += ["", "\\* ran beside another notebook in that `make course` run (two at a time): alone it is faster."]
    return "\n".join(lines)


def with_table(guide: str, table: str) -> str:
    """``guide`` with the text between its markers replaced by ``table``."""
    if BEGIN not in guide or END not in guide:
        raise ValueError(f"INSTRUCTORS.md lacks its timing-table markers ({BEGIN!r} … {END!r})")
    head, rest = guide.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


TABLE = "instructors-timing.md"     # under build/: the table of the last full run


def write_table(report: Path, guide: Path = GUIDE) -> bool:
    """Write the run's table to ``build/instructors-timing.md``; True when it differs from the guide's."""
    table = timing_table(report.read_text())
    (report.parent / TABLE).write_text(table + "\n")
    return with_table(guide.read_text(), table) != guide.read_text()


def update(report: Path | None = None, guide: Path = GUIDE) -> bool:
    """Rewrite the guide's table from ``report``; True when it changed."""
    report = report or paths.build_dir() / "report.md"
    text = guide.read_text()
    new = with_table(text, timing_table(report.read_text()))
    if new != text:
        guide.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--report", type=Path, default=None, help="default: build/report.md")
    parser.add_argument("--check", action="store_true", help="only say whether the table matches the report")
    a = parser.parse_args(argv)
    report = a.report or paths.build_dir() / "report.md"
    if not report.exists():
        print(f"No report at {paths.relative(report)}: run `make course` first.")
        return 1
    if a.check:
        same = with_table(GUIDE.read_text(), timing_table(report.read_text())) == GUIDE.read_text()
        print("INSTRUCTORS.md's timing table " + ("matches" if same else "does NOT match") + f" {paths.relative(report)}")
        return 0 if same else 1
    print("INSTRUCTORS.md's timing table " + ("rewritten" if update(report) else "already up to date")
          + f" from {paths.relative(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
