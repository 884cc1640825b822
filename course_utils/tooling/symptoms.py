"""The symptom index: the error messages people search, each with its cause, the notebook section that reproduces
it, and the fix.

The entries live in ``notebooks/appendix/symptoms.toml``; ``notebooks/appendix/symptom_index.md`` is written from them
(``python -m course_utils.tooling.tables --write``). Each entry's ``message`` is text the named notebook prints: the
test run of that notebook (tests/conftest.py, :func:`missing`) fails when its executed copy no longer shows it, so
the index cannot drift from what the course does; :func:`problems` checks the rest (the notebook and its section
exist, no message twice).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.tooling import routes

INDEX = paths.NOTEBOOKS / "appendix" / "symptoms.toml"
PAGE = paths.NOTEBOOKS / "appendix" / "symptom_index.md"
_FIELDS = {"message", "notebook", "section", "cause", "fix"}
_OPTIONAL = {"searched", "needs"}
# What a notebook needs of the machine to show a message (it explains and skips without it): how to ask.
NEEDS = {"slurm": lambda: _slurm_runs(), "memory limit": lambda: _memory_limits()}


def _slurm_runs() -> bool:
    from course_utils.kernel.launch import slurm_launch
    return slurm_launch.why_not() is None


def _memory_limits() -> bool:
    from course_utils.kernel.launch import memcap
    return memcap.available()


@dataclass(frozen=True)
class Symptom:
    message: str          # text the notebook's executed copy shows, verbatim
    notebook: str         # "09"
    section: int          # the "## N · title" section that reproduces it
    cause: str
    fix: str
    searched: str = ""    # how it usually reads elsewhere (a GPU machine, a cluster), when that differs
    needs: str = ""       # what of the machine the notebook needs to show it (a key of NEEDS), if anything


def load(path: Path = INDEX) -> list[Symptom]:
    entries = tomllib.loads(path.read_text()).get("symptom", [])
    return [Symptom(**{k: v for k, v in e.items() if k in _FIELDS | _OPTIONAL}) for e in entries]


def notebook_path(number: str, notebooks: Path = paths.NOTEBOOKS) -> Path | None:
    return routes.Step(number).notebook(notebooks)


def section_titles(notebook: Path) -> dict[int, str]:
    nb = nbformat.read(str(notebook), as_version=4)
    return {int(m[1]): m[2].strip() for c in nb.cells if c.cell_type == "markdown"
            for m in routes.SECTION.finditer(c.source)}


def problems(path: Path = INDEX, notebooks: Path = paths.NOTEBOOKS) -> list[str]:
    """What is wrong with the index itself: a field missing or unknown, a notebook or section that does not exist, a
    message too short to search for, or listed twice."""
    out, seen = [], set()
    for i, entry in enumerate(tomllib.loads(path.read_text()).get("symptom", []), 1):
        where = f"entry {i} ({str(entry.get('message', ''))[:40]!r})"
        if _FIELDS - set(entry) or set(entry) - _FIELDS - _OPTIONAL:
            out.append(f"{where}: fields {sorted(_FIELDS - set(entry))} missing, "
                       f"{sorted(set(entry) - _FIELDS - _OPTIONAL)} unknown")
            continue
        notebook = notebook_path(str(entry["notebook"]), notebooks)
        if notebook is None:
            out.append(f"{where}: no notebook {entry['notebook']}_*.ipynb")
        elif entry["section"] not in section_titles(notebook):
            out.append(f"{where}: {notebook.stem} has no section {entry['section']}")
        if entry.get("needs", "") not in ("", *NEEDS):
            out.append(f"{where}: needs {entry['needs']!r}, which is none of {sorted(NEEDS)}")
        if len(entry["message"]) < 15:
            out.append(f"{where}: a message this short finds everything; quote more of it")
        if entry["message"] in seen:
            out.append(f"{where}: listed twice")
        seen.add(entry["message"])
    return out


def output_text(executed: nbformat.NotebookNode) -> str:
    """Every output an executed notebook shows, as text (streams, results, errors), one cell after another."""
    parts = []
    for cell in executed.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif out.get("output_type") == "error":
                parts.append(f"{out.get('ename')}: {out.get('evalue')}")
            else:
                data = out.get("data", {})
                parts += [str(data.get(kind, "")) for kind in ("text/plain", "text/markdown", "text/html")]
    return "\n".join(parts)


def missing(notebook_stem: str, executed: nbformat.NotebookNode, path: Path = INDEX) -> list[str]:
    """The index's messages for this notebook that its executed copy does not show (leaving out those it shows only
    on a machine with what this one lacks: the notebook explains and skips there)."""
    number = notebook_stem.split("_")[0]
    text = output_text(executed)
    ours = [s for s in load(path) if s.notebook == number and s.message not in text]
    return [s.message for s in ours if not s.needs or NEEDS[s.needs]()]


def render(path: Path = INDEX, notebooks: Path = paths.NOTEBOOKS) -> str:
    """The index page, in the index's order (the most searched first)."""
    lines = ["# Symptom index", "",
             "Search this page (Ctrl-F) for the first line of the error in front of you. Each entry says why it "
             "happens, the notebook section where the course makes it happen on purpose (run it, read the cause in "
             "the source, then watch the fix work) and what to change. The messages are the words the notebooks "
             "print; where a GPU machine or a cluster words it differently, that line is given too. Every message "
             "here is checked against the notebook's own run (`make test`), so a message that changes with a new "
             "DeepSpeed or transformers version fails the tests until this page is updated.", ""]
    for s in load(path):
        notebook = notebook_path(s.notebook, notebooks)
        title = section_titles(notebook).get(s.section, "") if notebook else ""
        link = f"[{s.notebook} §{s.section} · {title}](../{notebook.name})" if notebook else f"{s.notebook} §{s.section}"
        lines += [f"### `{s.message}`", ""]
        if s.searched:
            lines += [f"Elsewhere it reads: `{s.searched}`", ""]
        lines += [f"- **Why:** {s.cause}", f"- **Reproduced in:** {link}", f"- **What to change:** {s.fix}", ""]
    return "\n".join(lines)


def page_drift() -> bool:
    return not PAGE.exists() or PAGE.read_text() != render()


def write_page() -> None:
    PAGE.write_text(render())
