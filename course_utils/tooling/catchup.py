"""Catch up: a notebook's state back, for a participant whose kernel died or who arrives late.

``make catchup NB=03 UPTO=3`` (``python -m course_utils.tooling.catchup 03 --upto 3``) runs the participant's own copy of
the notebook (``build/student/<notebook>.ipynb`` by default, made from the student edition when it is not there
yet; ``COPY=path`` for another one), in a fresh kernel, from the top down to the heading chosen (``UPTO``: a section
number, or words of any heading; left out: the whole notebook). Their cells are run as they wrote them and stay as
they are: the run only adds the outputs of the cells above the heading to their copy, so they can read what every
launch measured. The cells from the heading on are not touched. A check that fails (an exercise not written yet) is
reported and the run goes on, as the cells after an unsolved exercise use the course's answer.

The run ends by saving the kernel's variables (``build/catchup/<notebook>.pkl``); in JupyterLab, after
File ▸ Reload Notebook from Disk, one line in the participant's kernel brings them back::

    from course_utils.tooling.catchup import restore; restore("03")

so they go on with the section they chose without running the launches above it again. A value that cannot be
saved (a widget, an open file) is named, with the cell that made it, to run again by hand.
"""
from __future__ import annotations

import argparse
import copy as copy_module
import re
import sys
import time
from pathlib import Path
from typing import Iterator

import nbformat

from course_utils.common import paths
from course_utils.tooling.nbtools import parameterized, select, where

CELL_TIMEOUT = 1800          # seconds one cell may run; every launch inside has its own, shorter timeout
LARGEST_VALUE = 200 * 2**20  # bytes: a larger value (a big model, say) is not saved; its cell is named instead
SAVE = "__import__('course_utils.tooling.catchup').tooling.catchup.save_state({path!r}, {notebook!r}, {end})"


def state_file(name: str) -> Path:
    return paths.build_dir() / "catchup" / f"{name}.pkl"


def headings(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """Every markdown heading of ``nb`` as (cell index, heading text)."""
    return [(i, line.lstrip("#").strip()) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if re.match(r"#+\s", line)]


def cut_off(nb: nbformat.NotebookNode, upto: str | None) -> int:
    """The index of the cell holding the heading ``upto`` names (a section number such as "3", or words of the
    heading, case ignored); the cells above it are the ones to run. ``None``: the whole notebook."""
    if not upto:
        return len(nb.cells)
    wanted = upto.strip().lower()
    for i, text in headings(nb):
        number = re.match(r"(\d+)\s*·", text)
        if (number and number[1] == wanted) or (not wanted.isdigit() and wanted in text.lower()):
            return i
    raise SystemExit(f"no heading matches {upto!r}; the notebook's headings:\n"
                     + "\n".join(f"  {text}" for _, text in headings(nb)))


def learner_copy(name: str, copy: Path | None, folder: Path = paths.NOTEBOOKS) -> tuple[Path, Path]:
    """The participant's copy: ``copy``, or ``build/student/<notebook>.ipynb`` (made from the student edition when
    missing). The course's own notebooks are stored without outputs, so they are never a copy to fill."""
    from course_utils.tooling.student import student_copy

    notebook = select([name], folder)
    if len(notebook) != 1:
        raise SystemExit(f"NB={name} must name one notebook: {[nb.stem for nb in notebook] or 'none matches'}")
    # absolute: the kernel runs in the copy's folder, and the last cell reads the copy again from there
    path = Path(copy).resolve() if copy else paths.build_dir() / "student" / notebook[0].name
    if path.resolve().parent == paths.NOTEBOOKS.resolve():
        raise SystemExit(f"{path} is the course's own notebook, stored without outputs: catch up on a copy "
                         "(make student, or COPY=<your notebook>)")
    if not path.exists():
        if copy:
            raise SystemExit(f"{path} does not exist")
        student_copy(notebook[0], path.parent)
        print(f"no copy yet: {paths.relative(path)} is the student edition now")
    return notebook[0], path


def catch_up(name: str, upto: str | None = None, copy: Path | None = None, parameters: dict | None = None,
             timeout: int = CELL_TIMEOUT, folder: Path = paths.NOTEBOOKS) -> dict:
    """Run the participant's copy of notebook ``name`` down to the heading ``upto`` and write the outputs of those
    cells into the copy (their sources untouched); save the kernel's variables. Returns what happened:
    ``{"copy", "notebook" (the course's notebook it is a copy of), "ran", "errors": [(where the cell is, error
    name)], "heading", "state", "seconds", "save_output"}``."""
    from nbclient import NotebookClient

    course, path = learner_copy(name, copy, folder)
    nb = nbformat.read(str(path), as_version=4)
    end = cut_off(nb, upto)
    run = copy_module.deepcopy(nb)                               # the cells above the heading, to run
    run.cells = run.cells[:end]
    for i, cell in enumerate(run.cells):
        cell.metadata["catchup_index"] = i
    if parameters:
        run = parameterized(run, parameters)
    state = state_file(course.stem)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.unlink(missing_ok=True)
    run.cells.append(nbformat.v4.new_code_cell(SAVE.format(path=str(state), notebook=str(path), end=end)))
    started = time.monotonic()
    NotebookClient(run, timeout=timeout, allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = []
    for cell in run.cells[:-1]:
        i = cell.metadata.get("catchup_index")
        if i is None:                                            # the parameters the run injected
            continue
        target = nb.cells[i]
        if target.cell_type == "code":
            target.outputs, target.execution_count = cell.outputs, cell.execution_count
            errors += [(where(nb, i), o.ename) for o in cell.outputs if o.output_type == "error"]
    tmp = path.with_name(f".{path.name}.catchup")
    nbformat.write(nb, str(tmp))
    tmp.replace(path)
    saved = [o for o in run.cells[-1].outputs if o.output_type in ("stream", "error")]
    return {"copy": path, "notebook": course.stem, "ran": sum(c.cell_type == "code" for c in nb.cells[:end]), "errors": errors,
            "heading": next((text for i, text in headings(nb) if i == end), None),
            "state": state if state.exists() else None, "seconds": time.monotonic() - started,
            "save_output": "".join(o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}" for o in saved)}


def defined_by(sources: list[str]) -> dict[str, int]:
    """For each name the code ``sources`` bind at their top level (assign, def, class, import, for, with), the last
    source binding it."""
    import ast

    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp)

    def bound(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child.name
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                yield from ((a.asname or a.name).split(".")[0] for a in child.names)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                yield child.id
            if not isinstance(child, scopes):
                yield from bound(child)

    found = {}
    for i, source in enumerate(sources):
        try:
            found.update({name: i for name in bound(ast.parse(source))})
        except SyntaxError:                                      # a cell with IPython magics
            continue
    return found


def save_state(path: str, notebook: str, end: int | None = None) -> None:
    """In the catch-up kernel: pickle each of its variables (modules by name) to ``path``; say which could not be,
    with the cell of ``notebook`` (of those above cell ``end``, the ones run) that binds it."""
    import pickle
    import types

    import dill
    from IPython import get_ipython

    ns = get_ipython().user_ns
    hidden = set(get_ipython().user_ns_hidden)
    saved, skipped = {}, {}
    for name, value in list(ns.items()):
        if name.startswith("_") or name in hidden:
            continue
        if isinstance(value, types.ModuleType):
            saved[name] = ("module", value.__name__)
            continue
        try:
            data = dill.dumps(value, recurse=True)
        except Exception as e:                                   # a widget, an open file, a process handle, …
            skipped[name] = f"{type(e).__name__}"
            continue
        if len(data) > LARGEST_VALUE:
            skipped[name] = f"{len(data) / 2**20:.0f} MiB"
            continue
        saved[name] = ("value", data)
    nb = nbformat.read(notebook, as_version=4)
    code = [i for i, cell in enumerate(nb.cells[:end]) if cell.cell_type == "code"]
    cells = {name: where(nb, code[i]) for name, i in defined_by([nb.cells[i].source for i in code]).items()}
    with open(path, "wb") as out:
        pickle.dump({"saved": saved, "skipped": {k: (why, cells.get(k)) for k, why in skipped.items()}}, out)
    print(f"saved {len(saved)} variables" + (f"; not saved: {', '.join(sorted(skipped))}" if skipped else ""))


def load_state(path: Path) -> tuple[dict, dict]:
    """The variables saved by :func:`save_state` (modules imported again), and {name: (why, where its cell is)} of
    those that were not saved or do not load."""
    import importlib
    import pickle

    import dill

    with open(path, "rb") as f:
        data = pickle.load(f)
    values, skipped = {}, dict(data["skipped"])
    for name, (kind, payload) in data["saved"].items():
        try:
            values[name] = importlib.import_module(payload) if kind == "module" else dill.loads(payload)
        except Exception as e:
            skipped[name] = (type(e).__name__, None)
    return values, skipped


def restore(name: str) -> list[str]:
    """In the participant's kernel: bring back the variables ``make catchup NB=<name>`` saved; return their names."""
    from IPython import get_ipython

    found = select([name])
    if len(found) != 1:
        raise ValueError(f"{name!r} must name one notebook: {[nb.stem for nb in found] or 'none matches'}")
    path = state_file(found[0].stem)
    if not path.exists():
        raise FileNotFoundError(f"nothing saved for {found[0].stem}: run `make catchup NB={name}` first")
    values, skipped = load_state(path)
    get_ipython().user_ns.update(values)
    print(f"restored {len(values)} variables of {found[0].stem} (saved {time.ctime(path.stat().st_mtime)})")
    for var, (why, cell) in sorted(skipped.items()):
        print(f"  not restored: {var} ({why})" + (f"; run again the cell that makes it: {cell}" if cell else ""))
    return sorted(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", help="the notebook's number or name, e.g. 03")
    parser.add_argument("--upto", help="run the cells above this heading: a section number (3) or words of a heading")
    parser.add_argument("--copy", type=Path, help="the participant's notebook (default build/student/<notebook>.ipynb)")
    parser.add_argument("--smoke", action="store_true", help="with the smoke parameters (SMOKE=True)")
    a = parser.parse_args(argv)
    done = catch_up(a.notebook, a.upto, a.copy, {"SMOKE": True} if a.smoke else None)
    print(f"ran {done['ran']} code cells of {paths.relative(done['copy'])} in {done['seconds']:.0f} s"
          + (f", down to \u201c{done['heading']}\u201d" if done["heading"] else ", all of it"))
    for where_, ename in done["errors"]:
        print(f"  {ename} {where_}" + (" (an exercise not done yet)" if ename == "ExerciseNotDone" else ""))
    print(done["save_output"].strip())
    if done["state"]:
        print(f"Reload the notebook from disk in JupyterLab (File ▸ Reload Notebook from Disk), then run in it:\n"
              f"    from course_utils.tooling.catchup import restore; restore(\"{done['notebook'][:2]}\")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
