"""Every notebook's student copy (solutions removed by nbgrader) runs to the end: only the exercises' checks fail,
each with ExerciseNotDone, and every cell after an unsolved exercise runs on the course's answer. Whole runs of
every notebook, so `make test` leaves them out (each notebook's own test already replays every exercise's check
on the student source, in the kernel that ran the notebook): pytest -m extended tests/test_student_copies.py"""
import pytest

from conftest import student_errors
from course_utils.tooling import manifest
from course_utils.kernel.launch import slurm

pytestmark = [pytest.mark.extended, pytest.mark.notebook]


@pytest.mark.parametrize("name", list(manifest.load()))
def test_the_student_copy_runs_to_the_end(name, tmp_path):
    exercises, errors = student_errors(name, tmp_path, manifest.load()[name].get("student_parameters"))
    assert exercises >= 1, f"{name} has no exercise"
    assert errors == ["ExerciseNotDone"] * exercises, (
        f"on the student copy only the {exercises} exercises' checks may fail, each with ExerciseNotDone; cells raised {errors} "
        f"(the executed copy: {tmp_path / 'executed.ipynb'})")
    assert not slurm.leftovers(), "a Slurm cluster the student copy started outlived it"
