"""Running a submission and reading what it showed: :class:`GradeExecute`, nbgrader's ``Execute`` that grades a
submission as far as it got, and what the cells of an executed notebook tell (failed checks, crashes, timeouts).
"""
from __future__ import annotations

import time

import nbformat
from nbgrader.preprocessors import Execute
from traitlets import Integer

from course_utils.tooling.nbtools import where
from course_utils.tooling.workshop.nbgrader_course import STOP_WAIT

NOT_RUN = "CellNotRun"


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
