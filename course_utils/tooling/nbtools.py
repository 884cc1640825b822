"""Notebook files of the course: list the stored notebooks, strip their outputs.

Notebooks are stored without outputs or execution counts (a test enforces it). After working in
JupyterLab, ``python -m course_utils.tooling.nbtools strip notebooks/*.ipynb`` makes them storable again.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

from course_utils.common.paths import NOTEBOOKS

def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The course notebooks in order (00_… to 10_…)."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def select(prefixes: "list[str] | None", folder: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks whose names start with one of ``prefixes`` ("00 05", "03_zero"), or all of them."""
    return [nb for nb in notebooks(folder) if not prefixes or any(nb.stem.startswith(p) for p in prefixes)]


def heading(nb: nbformat.NotebookNode, index: int) -> str:
    """The section cell ``index`` is in: the last markdown heading above it."""
    for cell in reversed(nb.cells[:index]):
        if cell.cell_type == "markdown":
            heads = [line.lstrip("#").strip() for line in cell.source.splitlines() if line.startswith("#")]
            if heads:
                return heads[-1]
    return "the top"


def where(nb: nbformat.NotebookNode, index: int) -> str:
    """Cell ``index`` as a learner finds it in JupyterLab (which numbers no cells): its section and first line."""
    first = next((line.strip() for line in nb.cells[index].source.splitlines() if line.strip()), "")
    return f"in \u201c{heading(nb, index)}\u201d, the cell `{first[:50]}{'…' if len(first) > 50 else ''}`"


def parameterized(nb: nbformat.NotebookNode, parameters: dict) -> nbformat.NotebookNode:
    """A copy of ``nb`` with ``parameters`` in a cell injected after its ``parameters`` cell, as papermill does."""
    import copy

    from papermill.parameterize import parameterize_notebook

    nb = copy.deepcopy(nb)
    nb.metadata.setdefault("papermill", {"parameters": {}, "default_parameters": {}, "environment_variables": {}})
    for cell in nb.cells:                       # what papermill's load_notebook_node gives every cell
        cell.metadata.setdefault("tags", [])
        cell.metadata.setdefault("papermill", {})
    return parameterize_notebook(nb, parameters)


def strip(path: Path | str) -> bool:
    """Remove outputs and execution counts; return True when the file changed."""
    nb = nbformat.read(str(path), as_version=4)
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            cell.outputs, cell.execution_count, changed = [], None, True
    if changed:
        nbformat.write(nb, str(path))
    return changed


def has_outputs(path: Path | str) -> bool:
    nb = nbformat.read(str(path), as_version=4)
    return any(c.cell_type == "code" and (c.outputs or c.execution_count is not None) for c in nb.cells)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "strip":
        sys.exit("usage: python -m course_utils.tooling.nbtools strip NOTEBOOK...")
    for p in sys.argv[2:]:
        if strip(p):
            print(f"stripped {p}")


CUT_CELL = re.compile(r"<td>[^<]*(\.\.\.|…)</td>")


def cut_table_cells(nb: nbformat.NotebookNode) -> list[str]:
    """Where an executed notebook shows a table with a cell cut short (pandas ends it with "..."): ``cell N: text``."""
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            found += [f"cell {index}: {m.group(0)[:120]}" for m in CUT_CELL.finditer(html if isinstance(html, str) else "".join(html))]
    return found


def opening_box_drift(line_for, with_line, notebooks: Path = NOTEBOOKS, write: bool = False) -> list[str]:
    """The notebooks whose opening cell differs from ``with_line(source, line_for(path))`` (rewritten with ``write``):
    one generated line of the opening box, such as "On GPUs" or "Time to allow"."""
    out = []
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        new = with_line(nb.cells[0].source, line_for(path))
        if new != nb.cells[0].source:
            out.append(path.stem)
            if write:
                nb.cells[0].source = new
                nbformat.write(nb, str(path))
    return out
