"""Notebook 00 executed with papermill; its figures asserted. Its student copy (nbgrader's ClearSolutions) runs to
the end: each check raises ExerciseNotDone, every other cell succeeds."""
import pytest

from conftest import run_notebook, student_errors
from course_utils import hardware

NAME = "00_setup_and_first_launch"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    procs = hardware.detect().default_procs
    assert m["world_size"] == procs
    assert [r["rank"] for r in m["ranks"]] == list(range(procs))
    assert {r["world_size"] for r in m["ranks"]} == {procs}
    assert len({r["pid"] for r in m["ranks"]}) == procs, "each rank must be its own process"
    assert m["accelerator"] == hardware.detect().accelerator
    assert m["all_reduce_sum"] == procs * (procs + 1) / 2
    assert "cpu_adam" in m["ops_compatible"]
    # rank 1 raised while rank 0 waited in all_reduce: the error names rank 1 and shows its own traceback
    assert m["failure_first_line"].startswith("Rank 1 failed") and m["failure_names_cause"] is True


def test_every_check_fails_on_the_student_copy(tmp_path):
    exercises, errors = student_errors(NAME, tmp_path)
    assert exercises >= 2
    assert errors == ["ExerciseNotDone"] * exercises, (
        f"each of the {exercises} exercises must fail its check on the student copy and every other cell must "
        f"succeed there; cells raised {errors}")
