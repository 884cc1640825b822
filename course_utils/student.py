"""The student edition: each solution block replaced by ``raise NotImplementedError()``.

Solutions live in the course notebooks between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
inside a function body; the check in the next cell calls that function, so on the student copy
the check fails with its hint (tests prove it). ``make student`` writes ``build/student/``.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

from . import paths
from .nbtools import notebooks

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_BLOCK = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*$", re.M | re.S)


def strip_solutions(source: str) -> str:
    """Replace every solution block in ``source``; unbalanced markers are an error."""
    if source.count(BEGIN) != source.count(END):
        raise ValueError(f"Unbalanced solution markers in cell:\n{source[:200]}")
    return _BLOCK.sub(lambda m: f"{m.group(1)}raise NotImplementedError()", source)


def student_copy(notebook: Path, out_dir: Path) -> Path:
    nb = nbformat.read(str(notebook), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs, cell.execution_count = [], None
    out = out_dir / notebook.name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))
    return out


def main() -> int:
    out_dir = paths.build_dir() / "student"
    for nb in notebooks():
        print(f"wrote {paths.relative(student_copy(nb, out_dir))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
