"""The student edition, made by nbgrader's own ``ClearSolutions`` preprocessor.

Solutions live in the course notebooks between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` inside
an exercise cell; nbgrader replaces each block with ``# YOUR CODE HERE`` / ``raise NotImplementedError()``.
Every exercise cell carries nbgrader's metadata (``solution: true``) and its check cell is an autograded
test cell (``grade: true``, locked, one point), so an instructor's ``nbgrader generate_assignment`` and
``nbgrader autograde`` work on these notebooks unchanged. ``make student`` writes ``build/student/``.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.kernel.checks import STUB
from course_utils.tooling.nbtools import notebooks

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = f"# YOUR CODE HERE\n{STUB}"      # what checks.is_done looks for
_DEF = re.compile(r"^def (\w+)\(", re.M)
_CHECK_CALL = r"checks\.(?:check_function|solution|outcome|export_function|require_done)\(\s*{name}\b"   # its first argument


def clear_solutions(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with every solution block replaced by nbgrader's stub (in place); a solution outside a cell
    marked as an nbgrader solution cell is an error, as nbgrader's own pipeline would make it."""
    from nbgrader.preprocessors import ClearSolutions

    nb, _ = ClearSolutions(code_stub={"python": CODE_STUB}, enforce_metadata=True).preprocess(nb, {})
    return nb


def collapse_checks(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with the source of every check cell (nbgrader's autograded, locked cells) collapsed (in place), as
    JupyterLab shows a cell whose ``jupyter.source_hidden`` is set: a learner sees what the check printed, and opens
    the cell only to read it. Its second hint, shown after a check fails again, all but answers the exercise."""
    for cell in nb.cells:
        grader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and grader.get("grade") and not grader.get("solution"):
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    return nb


def student_copy(notebook: Path, out_dir: Path) -> Path:
    nb = collapse_checks(clear_solutions(nbformat.read(str(notebook), as_version=4)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    out = out_dir / notebook.name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))
    return out


def student_source(source: str) -> str:
    """One cell's source as the student edition has it (nbgrader's replacement, same stub)."""
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "x", "locked": False,
                                 "schema_version": 3, "task": False}
    nb = nbformat.v4.new_notebook(cells=[cell])
    return clear_solutions(nb).cells[0].source


def exercise_function(source: str) -> str:
    """The name of the function whose body holds the (first) solution block of an exercise cell."""
    return _DEF.findall(source[:source.index(BEGIN)])[-1]


def exercises(nb: nbformat.NotebookNode) -> list[dict]:
    """Each exercise of a course notebook: its function, its cell and its check cell (the first later code
    cell that hands the function, as first argument, to a ``checks`` call), as ``{"name", "cell", "check"}`` with cell indices."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or BEGIN not in cell.source:
            continue
        name = exercise_function(cell.source)
        check = next((j for j in range(i + 1, len(nb.cells)) if nb.cells[j].cell_type == "code"
                      and re.search(_CHECK_CALL.format(name=name), nb.cells[j].source, re.S)), None)
        found.append({"name": name, "cell": i, "check": check})
    return found


def nbgrader_metadata(nb: nbformat.NotebookNode, prefix: str) -> dict[int, dict]:
    """The nbgrader metadata each exercise and check cell of ``nb`` should carry, by cell index:
    an answer cell (``solution``) and a locked, autograded one-point test cell (``grade``) per exercise."""
    wanted = {}
    for ex in exercises(nb):
        wanted[ex["cell"]] = {"grade": False, "grade_id": f"{prefix}-{ex['name']}", "locked": False,
                              "schema_version": 3, "solution": True, "task": False}
        if ex["check"] is not None:
            wanted[ex["check"]] = {"grade": True, "grade_id": f"{prefix}-{ex['name']}-check", "locked": True,
                                   "points": 1, "schema_version": 3, "solution": False, "task": False}
    return wanted


def mark(path: Path) -> bool:
    """Write the nbgrader metadata of every exercise and check cell into the stored notebook ``path``
    (other cells lose any stale nbgrader metadata); True when the file changed."""
    import json

    nb = nbformat.read(str(path), as_version=4)
    wanted = nbgrader_metadata(nb, prefix=path.stem[:2])
    raw = json.loads(path.read_text())
    for i, cell in enumerate(raw["cells"]):
        if i in wanted:
            cell["metadata"]["nbgrader"] = wanted[i]
        else:
            cell["metadata"].pop("nbgrader", None)
    text = json.dumps(raw, indent=1, ensure_ascii=False) + "\n"
    if text == path.read_text():
        return False
    path.write_text(text)
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--mark"]:      # after adding or moving an exercise: python -m course_utils.tooling.student --mark
        for nb in notebooks():
            if mark(nb):
                print(f"marked the exercise and check cells of {paths.relative(nb)}")
        return 0
    out_dir = paths.build_dir() / "student"
    for nb in notebooks():
        print(f"wrote {paths.relative(student_copy(nb, out_dir))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
