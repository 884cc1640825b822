"""Notebook files of the course: write one from cells, strip outputs, list the stored notebooks.

Notebooks are stored without outputs or execution counts (a test enforces it). After working in
JupyterLab, ``python -m course_utils.nbtools strip notebooks/*.ipynb`` makes them storable again.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from .paths import NOTEBOOKS

KERNEL = {"name": "deepspeed-course", "display_name": "DeepSpeed course (.venv)", "language": "python"}


def notebooks() -> list[Path]:
    """The course notebooks in order (00_… to 10_…)."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def write(path: Path | str, cells: list[tuple[str, str]]) -> None:
    """Write a notebook from ``(kind, source)`` pairs; kind is "md", "code" or "parameters"."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    for kind, source in cells:
        source = source.strip("\n")
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
            nb.cells.append(cell)
    for i, cell in enumerate(nb.cells):       # stable ids keep diffs small
        cell["id"] = f"c{i:02d}"
    nbformat.write(nb, str(path))


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
