"""A workshop with nbgrader: release the student notebooks, grade what participants hand in, with feedback.

``make release`` (``python -m course_utils.workshop release``) makes ``build/nbgrader/`` an nbgrader course folder:
its ``nbgrader_config.py`` (written here), ``source/<notebook>/`` (the course notebook: one assignment per
notebook), ``release/<notebook>/`` (what ``nbgrader generate_assignment`` makes of it: solutions cleared by
nbgrader's ClearSolutions with the course's stub, checks kept as locked, autograded one-point cells) and
``gradebook.db``.

``make grade SUBMISSIONS=<folder>`` autogrades a folder in nbgrader's layout,
``<folder>/<participant>/<notebook>/<notebook>.ipynb``, on a copy (``build/nbgrader/submitted/``; with ``--smoke``
each copy's ``parameters`` cell gets the tests' settings, as papermill injects them), writes
``build/nbgrader/grades.csv`` (participant × exercise → points), each participant's feedback as HTML
(``build/nbgrader/feedback/<participant>/<notebook>/``), and prints what each submission got and where it stopped.

nbgrader runs every cell with a time limit: a cell that runs longer is interrupted, shows a ``CellTimeoutError``,
and the cells after it run. :class:`GradeExecute` adds what nbgrader would otherwise turn into a submission without
any grade: a kernel that dies, or a cell that does not stop when interrupted. The cells after it are marked as not
run (an error each, so their checks score nothing) and the submission is graded as far as it got. The graded
notebooks' launches write under ``build/grading/``, never over the course's own ``build/runs`` and metrics.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import nbformat
from nbgrader.preprocessors import Execute
from sqlalchemy.exc import SAWarning
from traitlets import Integer

from . import paths
from .nbtools import parameterized, select, where
from .student import CODE_STUB

COURSE_ID = "deepspeed-course"
CELL_TIMEOUT = 300    # seconds per cell: the longest cell of a full `make course` on 2 cores takes under 90 s, and
                      # every launch inside a cell has its own TIMEOUT, which stops a hung launch with its ranks' stacks
SMOKE = {"SMOKE": True}
STOP_WAIT = 60        # seconds a cell interrupted at its timeout has to stop (a launch is killed in a few)
NOT_RUN = "CellNotRun"

CONFIG = '''\
# nbgrader's configuration for the DeepSpeed course, rewritten by `make release` and `make grade`
# (course_utils/workshop.py): change their options rather than this file. nbgrader's own commands read it too:
# cd {root} && nbgrader <command>
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
c.Exchange.root = {exchange!r}
# the course's stub: checks.is_done looks for it, so the cells after an unsolved exercise use the course's answer
c.ClearSolutions.code_stub = {{"python": {stub!r}}}
c.ClearSolutions.enforce_metadata = True
# each cell may run {timeout} s; then it is interrupted, gets a CellTimeoutError and the next cells run
c.Execute.timeout = {timeout}
c.Execute.interrupt_on_timeout = True
c.GradeExecute.stop_wait = {stop_wait}
# nbgrader's autograde steps, with the course's Execute: a dead kernel or a cell that ignores the interrupt
# stops the submission there (the cells after it score nothing) instead of losing its every grade
c.Autograde.autograde_preprocessors = [
    "course_utils.workshop.GradeExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
'''


def root() -> Path:
    """The nbgrader course folder: ``build/nbgrader``."""
    return paths.build_dir() / "nbgrader"


def _error(ename: str, evalue: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class GradeExecute(Execute):
    """nbgrader's ``Execute``, graded as far as it got when the kernel dies or a cell does not stop when interrupted.

    nbgrader interrupts a cell that runs past ``timeout``; when the cell has not stopped a few seconds later (or the
    kernel died), nbclient raises, and nbgrader drops the whole submission. Here the cell gets the error instead;
    when the kernel answers within ``stop_wait`` seconds more, the next cells run, otherwise each later code cell gets
    a ``CellNotRun`` error and the kernel is killed.
    """
    stop_wait = Integer(STOP_WAIT, help="seconds a cell interrupted at its timeout has to stop before the rest is given up"
                        ).tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._stopped, self.shutdown_kernel = "", "graceful"
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        if self._stopped:
            if cell.cell_type == "code" and cell.source.strip():
                cell.outputs, cell.execution_count = [_error(NOT_RUN, self._stopped)], None
            return cell, self.resources
        try:
            return super().preprocess_cell(cell, resources, index)
        except CellTimeoutError:
            cell.outputs.append(_error("CellTimeoutError", f"ran past {self.timeout} s and did not stop when interrupted"))
            if not self._answers():
                self._stop(f"an earlier cell did not stop when interrupted after {self.timeout} s")
        except DeadKernelError:
            cell.outputs.append(_error("DeadKernelError", "the kernel died while this cell ran"))
            self._stop("the kernel died in an earlier cell")
        return cell, self.resources

    def _answers(self) -> bool:
        """Whether the kernel runs an empty cell within ``stop_wait`` (it finished the interrupted one after all)."""
        from queue import Empty

        from jupyter_core.utils import run_sync

        asked, deadline = self.kc.execute("", silent=True, store_history=False), time.monotonic() + self.stop_wait
        get = run_sync(self.kc.shell_channel.get_msg)
        while (left := deadline - time.monotonic()) > 0:
            try:
                if get(timeout=left)["parent_header"].get("msg_id") == asked:
                    return True
            except Empty:
                break
        return False

    def _stop(self, why: str) -> None:
        self._stopped, self.shutdown_kernel = why, "immediate"     # no graceful shutdown for a kernel that hangs


def write_config(timeout: int = CELL_TIMEOUT, stop_wait: int = STOP_WAIT) -> Path:
    """Write ``build/nbgrader/nbgrader_config.py``; return its path."""
    folder = root()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exchange").mkdir(exist_ok=True)
    config = folder / "nbgrader_config.py"
    config.write_text(CONFIG.format(root=str(folder.resolve()), course_id=COURSE_ID,
                                    db_url=f"sqlite:///{(folder / 'gradebook.db').resolve()}",
                                    exchange=str((folder / "exchange").resolve()), stub=CODE_STUB, timeout=timeout,
                                    stop_wait=stop_wait))
    return config


def alembic_head() -> str:
    """The gradebook schema's version, which nbgrader asks the ``alembic`` command for when it creates a gradebook
    (a second interpreter: seconds, and only where ``alembic`` is on the PATH), read in this process instead."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


def nbgrader_api(timeout: int = CELL_TIMEOUT, stop_wait: int = STOP_WAIT):
    """nbgrader's Python API on the course folder, configured by the ``nbgrader_config.py`` written here."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    import nbgrader.api

    nbgrader.api.get_alembic_version = alembic_head
    config_file = write_config(timeout, stop_wait)
    config = PyFileConfigLoader(config_file.name, path=str(config_file.parent)).load_config()
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def _succeeded(result: dict, what: str) -> None:
    if not result["success"]:
        raise RuntimeError(f"{what} failed:\n{result.get('log', '')}\n{result.get('error', '')}")


def released(assignment: str) -> Path:
    return root() / "release" / assignment / f"{assignment}.ipynb"


def release(selected: "list[str] | None" = None, folder: Path = paths.NOTEBOOKS, api=None) -> list[Path]:
    """Generate the student assignment of each selected notebook of ``folder`` with ``nbgrader generate_assignment``
    (one assignment per notebook, named after it); return the released notebooks."""
    api = api or nbgrader_api()
    chosen = select(selected, folder)
    if not chosen:
        raise SystemExit(f"no notebook of {paths.relative(folder)} starts with {' or '.join(selected or [])}")
    out = []
    for notebook in chosen:
        source = root() / "source" / notebook.stem / notebook.name
        source.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(notebook, source)
        _succeeded(api.generate_assignment(notebook.stem, force=True, create=True),
                   f"nbgrader generate_assignment {notebook.stem}")
        out.append(released(notebook.stem))
    return out


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


def problems_of(nb: nbformat.NotebookNode) -> tuple[list[str], list[str]]:
    """From an autograded notebook: the checks that failed (with their error) and what else went wrong, in order."""
    failed, problems, not_run = [], [], []
    for i, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if cell.cell_type != "code" or not errors:
            continue
        names = [o.ename for o in errors]
        check = cell.metadata.get("nbgrader", {})
        if NOT_RUN in names:
            not_run.append(i)
        elif "DeadKernelError" in names:
            problems.append(f"the kernel died {where(nb, i)}")
        elif "CellTimeoutError" in names:
            stuck = any("did not stop" in o.evalue for o in errors)
            problems.append(f"timed out {where(nb, i)}: "
                            + ("it did not stop when interrupted" if stuck else "interrupted, the cells after it ran"))
        elif not check.get("grade"):
            problems.append(f"{names[-1]} {where(nb, i)}")
        if check.get("grade"):
            why = {NOT_RUN: "not run", "CellTimeoutError": "timed out", "DeadKernelError": "kernel died"}
            failed.append(f"{check['grade_id'].removesuffix('-check')} "
                          f"({next((why[n] for n in names if n in why), names[-1])})")
    if not_run:
        problems.append(f"{len(not_run)} code cells after it not run")
    return failed, problems


def unscored_checks(nb: nbformat.NotebookNode) -> list[str]:
    """The check cells of an executed notebook that nbgrader's autograde would not give all their points (an error,
    anything on stderr, a number as the cell's result), as "grade_id: what it showed"."""
    from nbgrader.utils import determine_grade, is_grade

    found = []
    for cell in nb.cells:
        if cell.cell_type == "code" and is_grade(cell):
            points, most = determine_grade(cell)
            if points != most:
                shown = next((o.get("text") or f"{o.get('ename')}: {o.get('evalue')}" for o in cell.outputs
                              if o.output_type == "error" or o.get("name") == "stderr"), "a number as its result")
                found.append(f"{cell.metadata.nbgrader.grade_id}: {shown.strip()[:300]}")
    return found


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="generate the student assignments with nbgrader")
    rel.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 00 05")
    gra = sub.add_parser("grade", help="autograde a folder <participant>/<notebook>/<notebook>.ipynb")
    gra.add_argument("submissions", type=Path)
    gra.add_argument("--smoke", action="store_true", help="run the submissions with the smoke parameters (SMOKE=True)")
    gra.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help=f"seconds per cell (default {CELL_TIMEOUT})")
    a = parser.parse_args(argv)
    if a.command == "release":
        for path in release(a.only):
            print(f"released {paths.relative(path)}")
        print(f"nbgrader course folder: {paths.relative(root())} (gradebook.db, nbgrader_config.py)")
        return 0
    if not a.submissions.is_dir():
        parser.error(f"SUBMISSIONS={a.submissions} is not a folder of <participant>/<notebook>/<notebook>.ipynb")
    return 1 if any(r.error for r in grade(a.submissions, a.smoke, a.timeout)) else 0


if __name__ == "__main__":
    sys.exit(main())
