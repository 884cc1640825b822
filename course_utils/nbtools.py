"""Notebook files of the course: list the stored notebooks, strip their outputs.

Notebooks are stored without outputs or execution counts (a test enforces it). After working in
JupyterLab, ``python -m course_utils.nbtools strip notebooks/*.ipynb`` makes them storable again.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from .paths import NOTEBOOKS

def notebooks() -> list[Path]:
    """The course notebooks in order (00_… to 10_…)."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


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
        sys.exit("usage: python -m course_utils.nbtools strip NOTEBOOK...")
    for p in sys.argv[2:]:
        if strip(p):
            print(f"stripped {p}")
