"""A workshop with nbgrader: `make release`, `make grade`, `make catchup` (course_utils.tooling.workshop and .catchup).

The default tests grade a drill: a small notebook built the course's way (parameters, two exercises marked by
``student.nbgrader_metadata``, checks from ``course_utils.kernel.checks``, a fallback), so nbgrader's whole round trip
(release, submissions, autograde with the smoke parameters, gradebook, feedback) and every way a submission can stop
cost seconds. Grading real notebooks executes each submission, launches and all (40 to 50 s per submission of 00 or
05 with the smoke parameters on 2 busy cores): those tests carry the ``workshop`` marker, which ``make test`` leaves
out; run them with ``pytest -m workshop tests/test_workshop.py``.
"""
from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import nbformat
import pytest

from conftest import SMOKE
from course_utils.tooling import catchup, student, workshop
from course_utils.common import paths
from course_utils.tooling.student import BEGIN, CODE_STUB

DRILL = "99_drill"
STUCK = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)   # an interrupt does not stop it\ntime.sleep(120)"


def _code(source: str, **metadata) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, metadata=metadata)


def drill(folder: Path) -> Path:
    """A small notebook written the course's way, marked for nbgrader as ``student --mark`` marks the course."""
    md = nbformat.v4.new_markdown_cell
    nb = nbformat.v4.new_notebook(cells=[
        md("# 99 · Drill"),
        _code("SMOKE = False      # True in the tests", tags=["parameters"]),
        md("## 1 · Twice"),
        _code("import json\nimport course_utils as cu"),
        md("### Exercise 1 · Double"),
        _code(f"def double(x: int) -> int:\n    {BEGIN}\n    return 2 * x\n    ### END SOLUTION"),
        _code('cu.checks.check_function(double, [((2,), 4), ((5,), 10)], hint="twice x")'),
        md("## 2 · Use it"),
        _code('used = cu.checks.answer_or(double, 21, fallback=42, instead="the course\'s double")\n'
              '(cu.paths.build_dir() / "drill.json").write_text(json.dumps({"smoke": SMOKE, "used": used}))'),
        md("### Exercise 2 · Half"),
        _code(f"def half(x: float) -> float:\n    {BEGIN}\n    return x / 2\n    ### END SOLUTION"),
        _code('cu.checks.check_function(half, [((4,), 2)], hint="x over two")'),
        md("## 3 · The end"),
        _code('print("the end")'),
    ], metadata={"kernelspec": {"name": "deepspeed-course", "display_name": "DeepSpeed course (.venv)",
                                "language": "python"}, "language_info": {"name": "python"}})
    for i, meta in student.nbgrader_metadata(nb, prefix="99").items():
        nb.cells[i].metadata["nbgrader"] = meta
    path = folder / f"{DRILL}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def solved(course: nbformat.NotebookNode, released: nbformat.NotebookNode, names: set[str]) -> nbformat.NotebookNode:
    """The released notebook with the course's solution of the exercises ``names`` put back."""
    nb = copy.deepcopy(released)
    for ex in student.exercises(course):
        if ex["name"] in names:
            assert student.student_source(course.cells[ex["cell"]].source) == nb.cells[ex["cell"]].source
            nb.cells[ex["cell"]].source = course.cells[ex["cell"]].source
    return nb


def inserted(nb: nbformat.NotebookNode, before: str, source: str) -> nbformat.NotebookNode:
    """``nb`` with a code cell of the participant's own right before the markdown cell that starts with ``before``."""
    nb = copy.deepcopy(nb)
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith(before))
    nb.cells.insert(at, nbformat.v4.new_code_cell(source))
    return nb


def hand_in(folder: Path, participant: str, name: str, nb: nbformat.NotebookNode) -> None:
    """A collected submission in nbgrader's layout: <folder>/<participant>/<assignment>/<notebook>.ipynb."""
    path = folder / participant / name / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def grades() -> dict[str, dict]:
    with (workshop.root() / "grades.csv").open() as f:
        return {row["participant"]: row for row in csv.DictReader(f)}


def three_drill_submissions(tmp_path: Path) -> tuple[Path, nbformat.NotebookNode, nbformat.NotebookNode]:
    """The drill released, and handed in by "all" (solved), "none" (as released) and "one" (exercise "double"
    solved): the collected folder, the course's notebook and the released one."""
    source = drill(tmp_path / "course")
    released_path, = workshop.release(["99"], folder=source.parent)
    course, released = read(source), read(released_path)
    collected = tmp_path / "collected"
    hand_in(collected, "all", DRILL, course)
    hand_in(collected, "none", DRILL, released)
    hand_in(collected, "one", DRILL, solved(course, released, {"double"}))
    return collected, course, released


@pytest.fixture
def build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build folder of this test's own: its nbgrader course folder and gradebook start empty."""
    folder = tmp_path / "build"
    monkeypatch.setenv("COURSE_BUILD_DIR", str(folder))
    return folder


def test_release_is_nbgraders_student_edition(build, tmp_path):
    """`make release NB="00 05"`: nbgrader's generate_assignment gives the student edition (the course's stub, which
    checks.is_done looks for), the checks locked, and one point per exercise in the gradebook."""
    released = workshop.release(["00", "05"])
    assert [p.parent.name for p in released] == ["00_setup_and_first_launch", "05_memory_planning"]
    api = workshop.nbgrader_api()
    for path in released:
        course = read(paths.NOTEBOOKS / path.name)
        edition = read(student.student_copy(paths.NOTEBOOKS / path.name, tmp_path / "student"))
        nb = read(path)
        assert [c.source for c in nb.cells] == [c.source for c in edition.cells]
        for ex in student.exercises(course):
            assert all(line in nb.cells[ex["cell"]].source for line in CODE_STUB.splitlines())
            check = nb.cells[ex["check"]]
            assert check.metadata["nbgrader"]["locked"] and check.metadata["editable"] is False
            assert check.metadata["jupyter"]["source_hidden"], "a check's hints are collapsed, as in make student"
        assert not any(c.get("outputs") for c in nb.cells)
        with api.gradebook as gb:
            assert gb.find_assignment(path.parent.name).max_score == len(student.exercises(course))
    assert (workshop.root() / "nbgrader_config.py").read_text().count("course_utils.tooling.workshop.GradeExecute") == 1


def test_grading_drill_full_none_and_one(build, tmp_path):
    """Three submissions of the drill, graded with the smoke parameters: all solved, none solved, one solved —
    full marks, zero, and exactly that exercise's point in the gradebook; feedback for each."""
    collected, course, released = three_drill_submissions(tmp_path)
    results = {r.participant: r for r in workshop.grade(collected, smoke=True, timeout=30)}
    assert {p: (r.points, r.max_points) for p, r in results.items()} == {"all": (2, 2), "none": (0, 2), "one": (1, 2)}
    assert {p: (row["99-double"], row["99-half"], row["points"]) for p, row in grades().items()} == {
        "all": ("1", "1", "2"), "none": ("0", "0", "0"), "one": ("1", "0", "1")}
    for participant in results:
        assert (workshop.root() / "feedback" / participant / DRILL / f"{DRILL}.html").stat().st_size > 1000


@pytest.mark.extended      # the three-submission drill above is the default run's round trip through nbgrader
def test_grading_drill_full_none_one_and_submissions_that_crash_or_hang(build, tmp_path, capsys):
    """Six submissions of the drill, graded with the smoke parameters and 4 s per cell: all solved, none solved,
    one solved; one whose cell raises and whose kernel then dies; one with a cell that nbgrader interrupts at its
    timeout and a later one that ignores the interrupt; one of notebook 05 under another file name. Each is graded as far as it got
    and the others all are."""
    collected, course, released = three_drill_submissions(tmp_path)
    hand_in(collected, "crash", DRILL, inserted(inserted(course, "## 2", 'raise RuntimeError("my mistake")'),
                                                "### Exercise 2", "import os\nos._exit(1)"))
    hand_in(collected, "hang", DRILL, inserted(inserted(course, "## 2", "import time\ntime.sleep(120)"),
                                               "### Exercise 2", STUCK))
    renamed = collected / "renamed" / "05_memory_planning"    # a course notebook not released yet, handed in as a copy
    renamed.mkdir(parents=True)
    nbformat.write(released, str(renamed / "05_memory_planning-Copy1.ipynb"))

    results = {r.participant: r for r in workshop.grade(collected, smoke=True, timeout=4, stop_wait=1)}

    assert {p: (r.points, r.max_points) for p, r in results.items()} == {
        "all": (2, 2), "none": (0, 2), "one": (1, 2), "crash": (1, 2), "hang": (1, 2), "renamed": (0, 2)}
    assert results["renamed"].error == "no 05_memory_planning.ipynb handed in (found: 05_memory_planning-Copy1.ipynb)"
    assert workshop.released("05_memory_planning").exists(), "grading releases a course notebook the gradebook lacks"
    table = grades()
    assert {p: (row["99-double"], row["99-half"], row["points"]) for p, row in table.items()} == {
        "all": ("1", "1", "2"), "none": ("0", "0", "0"), "one": ("1", "0", "1"), "crash": ("1", "0", "1"),
        "hang": ("1", "0", "1")}, "a submission nbgrader could not grade is no row of the gradebook"
    for participant in set(results) - {"renamed"}:
        assert (workshop.root() / "feedback" / participant / DRILL / f"{DRILL}.html").stat().st_size > 1000
    assert results["none"].failed_checks == ["99-double (ExerciseNotDone)", "99-half (ExerciseNotDone)"]
    assert results["none"].problems == [] and results["all"].problems == results["all"].failed_checks == []
    assert results["crash"].failed_checks == results["hang"].failed_checks == ["99-half (not run)"]
    crash, hang = results["crash"].problems, results["hang"].problems
    assert crash[0].startswith("RuntimeError in “Exercise 1 · Double”, the cell `raise RuntimeError(")
    assert crash[1].startswith("the kernel died in “2 · Use it”, the cell `import os`")
    assert crash[2] == hang[2] == "3 code cells after it not run"
    assert hang[0].startswith("timed out in “Exercise 1 · Double”, the cell `import time`: interrupted, the cells after")
    assert hang[1].startswith("timed out in “2 · Use it”, the cell `import signal, time`: it did not stop when interr")
    assert len(crash) == len(hang) == 3
    printed = capsys.readouterr().out
    assert "the kernel died" in printed and "05_memory_planning              NOT GRADED: no 05_memory_pl" in printed
    # the smoke parameters reached the graded kernels, whose build is their own; the collected copies are untouched
    assert json.loads((build / "grading" / "drill.json").read_text()) == {"smoke": True, "used": 42}
    assert read(collected / "one" / DRILL / f"{DRILL}.ipynb").cells == solved(course, released, {"double"}).cells
    assert not (build / "metrics").exists()


def test_catchup_runs_the_learners_copy_and_keeps_their_answers(build, tmp_path):
    """`make catchup NB=99 UPTO=3` on a copy with the learner's own double, a cell of their own (one of its values
    cannot be saved), and exercise 2 not done."""
    source = drill(tmp_path / "course")
    mine = read(student.student_copy(source, tmp_path / "mine"))
    ex = {e["name"]: e for e in student.exercises(read(source))}
    mine.cells[ex["double"]["cell"]].source = "def double(x: int) -> int:\n    return x + x      # my own"
    mine = inserted(mine, "### Exercise 2", "ten_times = used * 10\nsquares = (i * i for i in range(3))")
    copy_path = tmp_path / "mine" / f"{DRILL}.ipynb"
    nbformat.write(mine, str(copy_path))

    done = catchup.catch_up("99", upto="3", copy=copy_path, parameters=SMOKE, folder=source.parent)

    after = read(copy_path)
    assert [c.source for c in after.cells] == [c.source for c in mine.cells], "the learner's cells stay as they are"
    end = catchup.cut_off(after, "3")
    assert after.cells[end].source.startswith("## 3")
    code = [i for i, c in enumerate(after.cells) if c.cell_type == "code"]
    assert all(after.cells[i].execution_count for i in code if i < end)
    assert all(not after.cells[i].outputs and after.cells[i].execution_count is None for i in code if i > end)
    assert "check passed" in after.cells[ex["double"]["check"]].outputs[0].text
    assert [e for _, e in done["errors"]] == ["ExerciseNotDone"], "exercise 2 is not done: its check says so"
    values, skipped = catchup.load_state(done["state"])
    assert values["double"](5) == 10 and values["used"] == 42 and values["ten_times"] == 420
    assert values["SMOKE"] is True and values["cu"].__name__ == "course_utils"
    assert list(skipped) == ["squares"], "a generator cannot be saved: restore names the cell to run again"
    assert skipped["squares"][1] == "in “2 · Use it”, the cell `ten_times = used * 10`"


def test_catchup_takes_a_copy_by_a_relative_path_and_names_the_notebook_to_restore(build, tmp_path, monkeypatch, capsys):
    """`make catchup NB=99 COPY=try_1.ipynb`: the kernel runs in the copy's folder, so a path relative to where make
    runs must still find the copy there (the variables were saved, and the copy got its outputs); the line to run in
    JupyterLab names the course's notebook, not the copy's file."""
    source = drill(tmp_path / "course")
    (tmp_path / "work" / "mine").mkdir(parents=True)
    student.student_copy(source, tmp_path / "work" / "mine").rename(tmp_path / "work" / "mine" / "try_1.ipynb")
    monkeypatch.chdir(tmp_path / "work")

    done = catchup.catch_up("99", upto="3", copy=Path("mine/try_1.ipynb"), parameters=SMOKE, folder=source.parent)

    assert done["state"] is not None and "saved" in done["save_output"], done["save_output"]
    assert done["copy"] == (tmp_path / "work" / "mine" / "try_1.ipynb").resolve() and done["notebook"] == DRILL
    assert any(c.get("outputs") for c in read(done["copy"]).cells if c.cell_type == "code")
    monkeypatch.setattr(catchup, "catch_up", lambda *a, **k: done)
    catchup.main(["99", "--copy", "mine/try_1.ipynb"])
    assert 'restore("99")' in capsys.readouterr().out


def test_catchup_finds_sections_by_number_or_words():
    nb = read(paths.NOTEBOOKS / "00_setup_and_first_launch.ipynb")
    assert nb.cells[catchup.cut_off(nb, "3")].source.startswith("## 3 · The first launch")
    assert nb.cells[catchup.cut_off(nb, "roll call")].source.startswith("### Exercise 1 · Roll call")
    assert catchup.cut_off(nb, None) == len(nb.cells)
    with pytest.raises(SystemExit, match="1 · The stack"):
        catchup.cut_off(nb, "12")


def test_unscored_checks_are_the_checks_nbgrader_scores_below_full():
    cell = _code("cu.checks.check(True, 'hint')", nbgrader={"grade": True, "grade_id": "99-x-check", "points": 1,
                                                            "solution": False, "locked": True})
    nb = nbformat.v4.new_notebook(cells=[cell])
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✔ check passed\n")]
    assert workshop.unscored_checks(nb) == []
    cell.outputs.append(nbformat.v4.new_output("stream", name="stderr", text="FutureWarning: soon\n"))
    assert workshop.unscored_checks(nb) == ["99-x-check: FutureWarning: soon"]


@pytest.mark.workshop
def test_grading_two_course_notebooks(build, tmp_path):
    """The real thing: 00 and 05 released, three participants (all solved, none, one exercise), graded with the
    smoke parameters: full marks, zero, and exactly that exercise's point; feedback for each."""
    names = ["00_setup_and_first_launch", "05_memory_planning"]
    released = dict(zip(names, workshop.release(["00", "05"])))
    collected = tmp_path / "collected"
    one = {"00_setup_and_first_launch": "roll_call", "05_memory_planning": "bucket_bytes"}
    for name in names:
        course, handed_out = read(paths.NOTEBOOKS / f"{name}.ipynb"), read(released[name])
        hand_in(collected, "all", name, course)
        hand_in(collected, "none", name, handed_out)
        hand_in(collected, "one", name, solved(course, handed_out, {one[name]}))
    results = workshop.grade(collected, smoke=True)
    assert not [r for r in results if r.error or r.problems], workshop.summary(results)
    table = grades()
    exercises = [c for c in table["all"] if c[:2] in ("00", "05")]
    assert len(exercises) == 4
    assert all(table["all"][c] == "1" for c in exercises) and table["all"]["points"] == "4"
    assert all(table["none"][c] == "0" for c in exercises) and table["none"]["points"] == "0"
    assert {c for c in exercises if table["one"][c] == "1"} == {"00-roll_call", "05-bucket_bytes"}
    assert table["one"]["points"] == "2"
    for r in results:
        assert (workshop.root() / "feedback" / r.participant / r.assignment / f"{r.assignment}.html").exists()


@pytest.mark.workshop
def test_catchup_of_notebook_00_down_to_section_4(build):
    """The student edition of 00 with the learner's roll call, caught up to section 4: their answer ran in the launch."""
    name = "00_setup_and_first_launch"
    copy_path = student.student_copy(paths.NOTEBOOKS / f"{name}.ipynb", build / "student")
    course, nb = read(paths.NOTEBOOKS / f"{name}.ipynb"), read(copy_path)
    ex = {e["name"]: e for e in student.exercises(course)}
    nb = solved(course, nb, {"roll_call"})
    nbformat.write(nb, str(copy_path))
    done = catchup.catch_up("00", upto="4", parameters=SMOKE)
    after = read(copy_path)
    assert [c.source for c in after.cells] == [c.source for c in nb.cells]
    assert "check passed" in "".join(o.get("text", "") for o in after.cells[ex["roll_call"]["check"]].outputs)
    assert done["errors"] == []
    values, skipped = catchup.load_state(done["state"])
    assert "result" in values and "roll_call" in values, skipped
