"""Rules of the repository: stored notebooks are clean and follow the skeleton, pins agree."""
import re
from pathlib import Path

import nbformat
import pytest

from course_utils.common import paths
from course_utils.tooling.nbtools import has_outputs, notebooks
from course_utils.tooling import student
from course_utils.kernel import ops
from course_utils.tooling.student import BEGIN, END

NOTEBOOKS = notebooks()


def pins(text: str) -> dict:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", text, re.M)}


def test_environment_yml_and_requirements_pin_the_same_versions():
    req = pins((paths.ROOT / "requirements.txt").read_text())
    env = pins((paths.ROOT / "environment.yml").read_text())
    assert req and req == env


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_setup_and_first_launch.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    assert not has_outputs(path), f"{path.name} holds outputs: python -m course_utils.tooling.nbtools strip {path}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_follows_the_skeleton(path):
    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "deepspeed-course"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    assert re.search(r"^SMOKE = False", params[0].source, re.M), "parameters define SMOKE = False"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any(f'start("{path.stem}")' in s for s in code), "the notebook opens with cu.start(<its name>)"
    assert not any(re.search(r"^\s*!\s*deepspeed", s, re.M) for s in code), "launch through course_utils.kernel.launch"
    exercises = sum(s.count(BEGIN) for s in code)
    assert exercises >= 2, "at least two exercises"
    assert exercises == sum(s.count(END) for s in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercise_and_check_cells_carry_nbgrader_metadata(path):
    """Each exercise cell is an nbgrader solution cell and its check cell a locked, autograded test cell,
    so `nbgrader generate_assignment` / `autograde` work (after an edit: python -m course_utils.tooling.student --mark)."""
    nb = nbformat.read(str(path), as_version=4)
    found = student.exercises(nb)
    assert all(ex["check"] is not None for ex in found), f"an exercise without a check cell: {found}"
    wanted = student.nbgrader_metadata(nb, prefix=path.stem[:2])
    stored = {i: c.metadata["nbgrader"] for i, c in enumerate(nb.cells) if "nbgrader" in c.metadata}
    assert stored == wanted, "run: python -m course_utils.tooling.student --mark"


def test_grade_ids_are_unique_across_the_course():
    ids = [c.metadata["nbgrader"]["grade_id"] for p in NOTEBOOKS for c in nbformat.read(str(p), as_version=4).cells
           if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)) >= 2 * len(NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_student_edition_is_nbgraders_clear_solutions(path, tmp_path):
    nb = nbformat.read(str(path), as_version=4)
    solutions = [c.source for c in nb.cells if BEGIN in c.source]
    copy = nbformat.read(str(student.student_copy(path, tmp_path)), as_version=4)
    cells = [c.source for c in copy.cells if c.cell_type == "code"]
    assert not any(BEGIN in s or END in s for s in cells)
    assert sum(s.count("# YOUR CODE HERE\n") for s in cells) == sum(s.count(BEGIN) for s in solutions)
    blocks = [block.split(END)[0] for s in solutions for block in s.split(BEGIN)[1:]]     # a cell may hold several
    answers = {line.strip() for block in blocks for line in block.splitlines()[1:] if len(line.strip()) > 20}
    assert not any(a in s for a in answers for s in cells), "a solution line survived in the student edition"
    hidden = {i for i, c in enumerate(copy.cells) if c.metadata.get("jupyter", {}).get("source_hidden")
              and "record" not in c.metadata.get("tags", [])}
    checks = {ex["check"] for ex in student.exercises(nb) if ex["check"] is not None}
    assert hidden == checks, "the student edition collapses its check cells (their hints), and nothing else"


def test_student_source_keeps_indentation_and_removes_the_answer():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\nprint(f)"
    assert student.student_source(src) == ("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
                                           "\nprint(f)")


def test_course_runs_notebooks_side_by_side_except_those_that_must_run_alone():
    from course_utils.tooling import course

    a, b, timed = Path("a.ipynb"), Path("b.ipynb"), Path("t.ipynb")
    assert course.may_start(a, [], {timed}, 2) and course.may_start(b, [a], {timed}, 2)
    assert not course.may_start(b, [a, timed], set(), 2), "two lanes at most"
    assert not course.may_start(timed, [a], {timed}, 2), "a timed notebook waits until it is alone"
    assert not course.may_start(a, [timed], {timed}, 2), "nothing starts beside a timed notebook"
    assert course.may_start(timed, [], {timed}, 2)
    assert not course.may_start(b, [a], set(), 1), "--lanes 1: one at a time"
    runs = [course.Outcome("a", True, 5, a, started=0, ended=5), course.Outcome("b", True, 4, b, started=3, ended=7),
            course.Outcome("t", True, 2, timed, started=7, ended=9)]
    assert [course.beside(o, runs) for o in runs] == [["b"], ["a"], []]
    assert [course.beside(o, runs, build_until=3.5) for o in runs] == [["b", course.BUILD], ["a", course.BUILD], []]
    timing = {nb.stem for nb in NOTEBOOKS if course.runs_alone(nb)}
    assert {"04_offload_and_infinity", "10_capstone_translation"} <= timing


def test_course_starts_the_longest_shared_notebooks_first(tmp_path):
    from course_utils.tooling import course

    report = tmp_path / "report.md"
    report.write_text("| notebook | status | wall time | ran beside |\n|---|---|---|---|\n"
                      "| a | ok | 30 s | b |\n| b | ok | 120 s | a |\n| t | FAILED | 60 s | — |\n")
    assert course.previous_seconds(report) == {"a": 30.0, "b": 120.0, "t": 60.0}
    assert course.previous_seconds(tmp_path / "none.md") == {}
    beside_build = tmp_path / "fresh.md"      # a first run: the ops built beside it, which slowed it by the build's share
    beside_build.write_text(f"| a | ok | 90 s | b, {course.BUILD} |\n| b | ok | 40 s | a |\n")
    assert course.previous_seconds(beside_build) == {"a": 90 / ops.NOTEBOOKS_BESIDE_BUILD, "b": 40.0}
    a, b, new, timed = Path("a.ipynb"), Path("b.ipynb"), Path("new.ipynb"), Path("t.ipynb")
    assert course.lane_order([a, b, new, timed], {timed}, course.previous_seconds(report)) == [new, b, a, timed]
    assert course.lane_order([a, b, timed], {timed}, {}) == [a, b, timed], "no earlier run: course order"


def test_a_notebook_that_fails_ends_what_its_kernel_started_before_papermill_returns(tmp_path):
    """At a failing cell papermill asks the kernel to shut down; the kernel's clean-up at exit (atexit: a Slurm
    cluster's stop, about 3 s, up to 20) must finish before the notebook's test looks for processes left behind.
    jupyter_client's own 5 s (SIGTERM after 2.5) cut a 3 s stop short: notebook 18's cluster outlived it."""
    from course_utils.tooling import course

    done = tmp_path / "cleaned-up"
    nb = nbformat.v4.new_notebook(metadata=nbformat.read(str(NOTEBOOKS[0]), as_version=4).metadata)
    nb.cells = [nbformat.v4.new_code_cell(f"import atexit, pathlib, time\n"
                                          f"atexit.register(lambda: (time.sleep(4), pathlib.Path({str(done)!r}).touch()))\n"
                                          f"raise RuntimeError('a failing cell')")]
    nbformat.write(nb, str(tmp_path / "fails.ipynb"))
    outcome = course.execute(tmp_path / "fails.ipynb", tmp_path / "out.ipynb", cwd=tmp_path)
    assert not outcome.ok and "a failing cell" in outcome.error
    assert done.exists(), "the kernel was stopped before its clean-up at exit had ended"


# Modules that hold an exercise's answer for the ranks to fall back on (their docstrings say so): no notebook, and no
# module of the kernel side, may import them.
ANSWER_MODULES = ("course_utils.rank.ring_reference",)


def test_no_notebook_imports_a_module_that_holds_an_answer():
    import nbformat

    kernel_side = [p for p in (paths.ROOT / "course_utils").rglob("*.py") if "rank" not in p.relative_to(paths.ROOT).parts]
    sources = {p.name: p.read_text() for p in kernel_side}
    for nb in NOTEBOOKS:
        sources[nb.name] = "\n".join(c.source for c in nbformat.read(str(nb), as_version=4).cells if c.cell_type == "code")
    for module in ANSWER_MODULES:
        leaf = module.rsplit(".", 1)[1]
        assert (paths.ROOT / (module.replace(".", "/") + ".py")).exists(), module
        assert not [name for name, text in sources.items() if leaf in text], f"{module} is imported where a learner reads"


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem[:2])
def test_recording_the_figures_is_out_of_sight(path):
    """A ``nb.record(...)`` of three lines or more sits in a cell of its own, tagged "record" with its source hidden
    (JupyterLab shows it collapsed; the HTML leaves it out): the learner reads the figures, not the bookkeeping."""
    import ast
    from course_utils.tooling.study_time import RECORD_TAG

    nb = nbformat.read(str(path), as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "nb.record(" not in cell.source:
            continue
        for node in ast.walk(ast.parse(cell.source)):
            call = node if isinstance(node, ast.Call) else None
            if call is None or not (isinstance(call.func, ast.Attribute) and call.func.attr == "record"
                                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "nb"):
                continue
            if call.end_lineno - call.lineno + 1 < 3 or cell.source.lstrip().startswith("if "):
                continue
            hidden = RECORD_TAG in cell.metadata.get("tags", []) and cell.metadata.get("jupyter", {}).get("source_hidden")
            assert hidden, f"cell {i}: a {call.end_lineno - call.lineno + 1}-line nb.record in sight (tag it 'record', source hidden)"
            others = [n for n in ast.parse(cell.source).body
                      if not (isinstance(n, ast.Expr) and n.value is call)]
            assert not any("print(" in ast.unparse(n) or "check(" in ast.unparse(n) for n in others), \
                f"cell {i}: a hidden recording cell that also prints or checks: split the record into a cell of its own"


def test_each_notebook_is_executed_by_one_test_function_only():
    """run_notebook keeps what it executed for its own process only, and `make test`'s workers are two processes:
    a notebook executed by two test functions runs twice whenever the workers take one each. Its assertions belong in
    one test function (the same notebook on a described machine, ``machine=``, is another run and may have its own;
    tests/test_gpu.py runs in one process, `make test-gpu`, where the second call reuses the first run)."""
    import ast

    callers: dict[str, list[str]] = {}
    for test_file in sorted(set((paths.ROOT / "tests").glob("test_*.py")) - {paths.ROOT / "tests" / "test_gpu.py"}):
        tree = ast.parse(test_file.read_text())
        names = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
        for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            for call in ast.walk(function):
                if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "run_notebook" and call.args
                        and not any(k.arg == "machine" for k in call.keywords)):
                    first = call.args[0]
                    notebook = names.get(first.id) if isinstance(first, ast.Name) else getattr(first, "value", None)
                    callers.setdefault(str(notebook), []).append(f"{test_file.name}::{function.name}")
    twice = {nb: sorted(set(fs)) for nb, fs in callers.items() if len(set(fs)) > 1}
    assert not twice, f"notebooks executed by more than one test function (one run each, lost on the other worker): {twice}"
