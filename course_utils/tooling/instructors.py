"""INSTRUCTORS.md's timing table, generated from the report of a full ``make course`` run.

``make course`` writes ``build/report.md`` (each notebook's wall time on this machine) and the table made from
it to ``build/instructors-timing.md``; it never edits a tracked file, so a learner's checkout stays clean.
``make instructors`` (``python -m course_utils.tooling.instructors``) writes that run's times into the manifest
(``notebooks/manifest.toml``, :mod:`course_utils.tooling.manifest`) and the table made from them between the two markers
of INSTRUCTORS.md, so the committed table is always one a run measured; ``--check`` only says whether it matches.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.tooling import manifest as _manifest
from course_utils.tooling import study_time
from course_utils.tooling.manifest import between

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
    from course_utils.tooling.student import exercises

    return {nb.stem: len(exercises(nbformat.read(str(nb), as_version=4))) for nb in sorted(notebooks.glob("*.ipynb"))}


def slot_minutes(seconds: int, exercises: int) -> int:
    """A planning slot: reading and discussion, the exercises, and the notebook's own run time, rounded up to
    5 minutes. The first two are planning figures, not measurements."""
    return 5 * math.ceil((READING_MINUTES + MINUTES_PER_EXERCISE * exercises + seconds / 60) / 5)


def rows_of(report: str) -> list[dict]:
    """A report's notebook rows; a report without any is an error that says what to run."""
    rows = report_rows(report)
    if not rows:
        raise ValueError("no notebook rows in this report: run `make course` first")
    return rows


def timing_table(report: str, counts: dict[str, int] | None = None) -> str:
    """The markdown table of INSTRUCTORS.md from a report (and the exercises per notebook)."""
    return render(rows_of(report), counts)


def render(rows: list[dict], counts: dict[str, int] | None = None) -> str:
    """The table from rows of a report, or of the manifest's recorded run (:func:`course_utils.tooling.manifest.full_rows`)."""
    counts = exercise_counts() if counts is None else counts
    lines = ["| notebook | runs in (2 cores, measured) | exercises | plan a slot of | alone, about |", "|---|---|---|---|---|"]
    alone = {r["notebook"]: study_time.alone_minutes(paths.NOTEBOOKS / f"{r['notebook']}.ipynb", r["seconds"]) for r in rows}
    for r in rows:
        ran = f"{r['seconds'] // 60} min {r['seconds'] % 60:02d} s" + (" *" if r["beside"] else "")
        if not r["ok"]:
            ran += " (FAILED in that run)"
        n = counts.get(r["notebook"], 0)
        lines.append(f"| {r['notebook']} | {ran} | {n} | {slot_minutes(r['seconds'], n)} min | {alone[r['notebook']]} min |")
    total = sum(r["seconds"] for r in rows)
    slots = sum(slot_minutes(r["seconds"], counts.get(r["notebook"], 0)) for r in rows)
    on_own = sum(alone.values())
    lines.append(f"| **all, one after another** | {total // 60} min {total % 60:02d} s | {sum(counts.get(r['notebook'], 0) for r in rows)}"
                 f" | {slots // 60} h {slots % 60:02d} min | {on_own // 60} h {on_own % 60:02d} min |")
    lines += ["", "\\* ran beside another notebook (two at a time), or beside DeepSpeed's op build, in that `make course` run: alone it is faster."]
    return "\n".join(lines)


def with_table(guide: str, table: str) -> str:
    """``guide`` with the text between its markers replaced by ``table``."""
    return between(guide, BEGIN, END, table, "INSTRUCTORS.md")


TABLE = "instructors-timing.md"     # under build/: the table of the last full run


def would_change(report: Path, guide: Path = GUIDE, manifest: Path | None = None) -> bool:
    """Whether `make instructors` would change the manifest's recorded times (of the notebooks that passed in
    ``report``) or the guide's table."""
    recorded = {r["notebook"]: r for r in _manifest.full_rows(manifest or _manifest.MANIFEST)}
    differs = any(r["notebook"] not in recorded or recorded[r["notebook"]]["seconds"] != r["seconds"]
                  or bool(recorded[r["notebook"]]["beside"]) != bool(r["beside"])
                  for r in report_rows(report.read_text()) if r["ok"])
    return differs or with_table(guide.read_text(), render(list(recorded.values()))) != guide.read_text()


def write_table(report: Path, guide: Path = GUIDE, manifest: Path | None = None) -> bool:
    """Write the run's table to ``build/instructors-timing.md``; True when `make instructors` would change
    something (:func:`would_change`)."""
    (report.parent / TABLE).write_text(timing_table(report.read_text()) + "\n")
    return would_change(report, guide, manifest)


def update(report: Path | None = None, guide: Path = GUIDE, manifest: Path | None = None) -> bool:
    """Write ``report``'s times into the manifest and the guide's table from them; True when the guide changed."""
    report = report or paths.build_dir() / "report.md"
    rows = rows_of(report.read_text())
    _manifest.record_full_run([r for r in rows if r["ok"]], manifest or _manifest.MANIFEST)   # a failed run's time: no
    text = guide.read_text()
    new = with_table(text, render(_manifest.full_rows(manifest or _manifest.MANIFEST)))
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
        same = not would_change(report)
        print("INSTRUCTORS.md's timing table " + ("matches" if same else "does NOT match") + f" {paths.relative(report)}")
        return 0 if same else 1
    print("INSTRUCTORS.md's timing table " + ("rewritten" if update(report) else "already up to date")
          + f" from {paths.relative(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
