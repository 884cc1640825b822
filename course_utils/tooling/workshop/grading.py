"""``make grade``: copy the submissions in, autograde each one (:class:`~.execute.GradeExecute` runs it), write the
feedback and the gradebook CSV (participant × exercise → points), and print what each submission got.
"""
from __future__ import annotations

import csv
import os
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import nbformat
from sqlalchemy.exc import SAWarning

from course_utils.common import paths
from course_utils.tooling.nbtools import parameterized
from course_utils.tooling.workshop.execute import problems_of
from course_utils.tooling.workshop.nbgrader_course import CELL_TIMEOUT, STOP_WAIT, nbgrader_api, release, root

SMOKE = {"SMOKE": True}


def parameterize(path: Path, parameters: dict) -> None:
    """Give the notebook at ``path`` these parameters in place, as papermill does (a cell after ``parameters``)."""
    nbformat.write(parameterized(nbformat.read(str(path), as_version=4), parameters), str(path))


@contextmanager
def grading_build() -> Iterator[Path]:
    """The graded notebooks' build folder (``build/grading``): their runs and figures stay apart from the course's."""
    before = os.environ.get("COURSE_BUILD_DIR")
    folder = paths.build_dir() / "grading"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_BUILD_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("COURSE_BUILD_DIR", None)
        else:
            os.environ["COURSE_BUILD_DIR"] = before


@dataclass
class Graded:
    """What one submission (one participant, one notebook) got."""
    participant: str
    assignment: str
    points: float = 0.0
    max_points: float = 0.0
    seconds: float = 0.0
    failed_checks: list[str] = field(default_factory=list)      # "00-roll_call (ExerciseNotDone)"
    problems: list[str] = field(default_factory=list)           # where it crashed, timed out or stopped
    error: str = ""                                              # nbgrader could not grade it at all


def autograde(api, participant: str, assignment: str) -> Graded:
    """``nbgrader autograde`` of one submission already under ``submitted/``: its points, failed checks, problems."""
    graded = Graded(participant, assignment)
    with api.gradebook as gb:
        handed_out = gb.find_assignment(assignment)
        expected, graded.max_points = {f"{n.name}.ipynb" for n in handed_out.notebooks}, handed_out.max_score
    handed = {p.name for p in (root() / "submitted" / participant / assignment).glob("*.ipynb")}
    missing = [f"no {name} handed in (found: {', '.join(sorted(handed)) or 'nothing'})" for name in sorted(expected - handed)]
    if expected and not expected & handed:           # nbgrader would stop at "No notebooks found"
        graded.error = "; ".join(missing)
        return graded
    started = time.monotonic()
    with grading_build(), warnings.catch_warnings():
        # nbgrader adds a submission to its gradebook in a way SQLAlchemy 2 notes as "not in session": harmless
        warnings.filterwarnings("ignore", category=SAWarning)
        result = api.autograde(assignment, participant, force=True, create=True)
    graded.seconds = time.monotonic() - started
    if not result["success"]:
        log = (result.get("log", "") + result.get("error", "")).strip().splitlines()
        graded.error = next((line for line in log if "[ERROR]" in line), log[-1] if log else "nbgrader failed")
        return graded
    for path in sorted((root() / "autograded" / participant / assignment).glob("*.ipynb")):
        failed, problems = problems_of(nbformat.read(str(path), as_version=4))
        graded.failed_checks += failed
        graded.problems += problems
    graded.problems += [f"{m}: scored 0" for m in missing]
    with api.gradebook as gb:
        graded.points = gb.find_submission(assignment, participant).score
    return graded


def feedback(api, results: list[Graded]) -> None:
    """``nbgrader generate_feedback`` once per notebook (for all its graded participants: one HTML exporter);
    a submission left without its HTML says so."""
    for assignment in sorted({r.assignment for r in results if not r.error}):
        outcome = api.generate_feedback(assignment, force=True)
        for r in results:
            folder = root() / "feedback" / r.participant / assignment
            if r.assignment == assignment and not r.error and not any(folder.glob("*.html")):
                r.problems.append("no feedback HTML: " + (outcome.get("error") or "?").strip().splitlines()[-1])


def handed_in(folder: Path) -> list[tuple[str, str]]:
    """The (participant, notebook) pairs of a folder in nbgrader's layout, <participant>/<notebook>/."""
    def folders(parent: Path) -> list[Path]:
        return [f for f in sorted(parent.iterdir()) if f.is_dir() and not f.name.startswith(".")]

    return [(p.name, a.name) for p in folders(folder) for a in folders(p)]


def collect(submissions: Path, parameters: dict | None) -> list[tuple[str, str]]:
    """Copy every ``<participant>/<notebook>/`` of ``submissions`` into ``build/nbgrader/submitted/`` (with
    ``parameters`` injected into each notebook of the copy); return (participant, notebook) pairs. nbgrader's own
    ``submitted/`` (``nbgrader collect``) is graded where it is, and only as handed in."""
    submitted = root() / "submitted"
    if submissions.resolve() == submitted.resolve():
        if parameters:
            raise SystemExit(f"the smoke parameters change the notebooks graded: copy {submissions} elsewhere and "
                             "grade the copy")
        return handed_in(submissions)
    if submitted.resolve() in submissions.resolve().parents:
        raise SystemExit(f"{submissions} lies inside the folder grading copies to: give the collected folder")
    found = handed_in(submissions)
    for participant, assignment in found:
        copy = submitted / participant / assignment
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(submissions / participant / assignment, copy)
        for notebook in copy.glob("*.ipynb") if parameters else []:
            parameterize(notebook, parameters)
    return found


def gradebook_table(api) -> tuple[list[str], list[dict]]:
    """Participant × exercise → points from nbgrader's gradebook (every graded assignment, in course order); an
    exercise of a notebook the participant did not hand in is empty."""
    with api.gradebook as gb:
        assignments = sorted((a for a in gb.assignments if a.submissions), key=lambda a: a.name)
        exercises = [(a.name, n.name, c.name) for a in assignments for n in sorted(a.notebooks, key=lambda n: n.name)
                     for c in sorted(n.grade_cells, key=lambda c: c.name)]
        columns = ["participant", *(cell.removesuffix("-check") for _, _, cell in exercises), "points", "max_points"]
        rows = []
        for student in sorted(gb.students, key=lambda s: s.id):
            row, points, most = {"participant": student.id}, 0.0, 0.0
            handed_in = {s.assignment.name for s in student.submissions}
            for assignment, notebook, cell in exercises:
                if assignment in handed_in:
                    grade = gb.find_grade(cell, notebook, assignment, student.id)
                    row[cell.removesuffix("-check")] = grade.score
                    points, most = points + (grade.score or 0), most + grade.max_score
            rows.append({**row, "points": points, "max_points": most})
    return columns, rows


def write_grades(api, path: Path) -> Path:
    columns, rows = gradebook_table(api)
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: (f"{v:g}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows)
    return path


def summary(results: list[Graded]) -> str:
    """One line per submission (points, failed checks), then what stopped or crashed it."""
    width = max([len(r.participant) for r in results] + [11])
    lines = []
    for r in results:
        head = f"{r.participant:<{width}}  {r.assignment:<30}"
        if r.error:
            lines.append(f"{head}  NOT GRADED: {r.error}")
            continue
        lines.append(f"{head}  {r.points:g}/{r.max_points:g}  ({r.seconds:.0f} s)"
                     + (f"  failed: {', '.join(r.failed_checks)}" if r.failed_checks else ""))
        lines += [f"{'':<{width}}  ! {p}" for p in r.problems]
    return "\n".join(lines)


def grade(submissions: Path, smoke: bool = False, timeout: int = CELL_TIMEOUT, stop_wait: int = STOP_WAIT) -> list[Graded]:
    """Autograde every submission of ``submissions`` (releasing a notebook first when the gradebook lacks it),
    write the gradebook CSV and the feedback, print the summary. One submission's crash never stops the others."""
    api = nbgrader_api(timeout, stop_wait)
    pairs = collect(submissions, SMOKE if smoke else None)
    with api.gradebook as gb:
        known = {a.name for a in gb.assignments}
    missing = sorted({a for _, a in pairs} - known)
    if missing:
        release([m for m in missing if (paths.NOTEBOOKS / f"{m}.ipynb").exists()], api=api)
    print(f"grading {len(pairs)} submissions{' with the smoke parameters' if smoke else ''}, "
          f"each cell limited to {timeout} s", flush=True)
    results = []
    for participant, assignment in pairs:
        results.append(autograde(api, participant, assignment))
        print(summary(results[-1:]), flush=True)
    feedback(api, results)
    grades = write_grades(api, root() / "grades.csv")
    print(f"\n{summary(results)}\n\ngradebook: {paths.relative(grades)}; feedback: "
          f"{paths.relative(root() / 'feedback')}/<participant>/<notebook>/*.html")
    return results
