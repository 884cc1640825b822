"""Paths through the course: a few routes for the people who use it, each a list of notebooks and sections, with its
hours worked out from the notebooks themselves.

The routes live in ``notebooks/manifest.toml`` (``[path.<name>]``: ``title``, ``for_whom``, ``steps``, and ``led =
true`` for a route an instructor leads). A step is a notebook's two-digit prefix, optionally followed by the sections
to do (``"03 §1 §2 §6"``: sections 1, 2 and 6, with the notebook's opening, its exercises in those sections and its
recap). A route's hours: alone, the "Time to allow" figures of :mod:`course_utils.tooling.study_time` for the parts it
takes; led, the workshop slots of :mod:`course_utils.tooling.instructors`. ``python -m course_utils.tooling.tables
--write`` writes the routes' table into the README and INSTRUCTORS.md; tests/test_manifest.py fails when a route names
a notebook or section that does not exist, or a table drifts.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.tooling import study_time

MANIFEST = paths.NOTEBOOKS / "manifest.toml"
BEGIN = "<!-- paths table: written by `python -m course_utils.tooling.tables --write` from notebooks/manifest.toml -->"
END = "<!-- end of paths table -->"
SECTION = re.compile(r"^## (\d+) · ?(.*)$", re.M)   # a numbered section's heading: number, title


@dataclass(frozen=True)
class Step:
    prefix: str
    sections: tuple[int, ...] = ()        # () = the whole notebook

    @classmethod
    def parse(cls, text: str) -> "Step":
        m = re.fullmatch(r"(\d\d)((?:\s+§\d+)*)", text.strip())
        if m is None:
            raise ValueError(f"a route step is a notebook prefix and optional sections, e.g. \"03 §1 §2\": not {text!r}")
        return cls(m[1], tuple(int(s) for s in re.findall(r"§(\d+)", m[2])))

    def notebook(self, notebooks: Path = paths.NOTEBOOKS) -> Path | None:
        return next(iter(sorted(notebooks.glob(f"{self.prefix}_*.ipynb"))), None)

    def __str__(self) -> str:
        return self.prefix + "".join(f" §{s}" for s in self.sections)


def load(path: Path = MANIFEST) -> dict[str, dict]:
    with path.open("rb") as f:
        return tomllib.load(f).get("path", {})


def _sections_of(notebook: Path) -> list[tuple[int | None, list]]:
    """The notebook's cells grouped by numbered section: (None, opening cells), (1, …), …, (None, recap and after)."""
    nb = nbformat.read(str(notebook), as_version=4)
    groups: list[tuple[int | None, list]] = [(None, [])]
    for cell in nb.cells:
        m = SECTION.search(cell.source) if cell.cell_type == "markdown" else None
        if m:
            groups.append((int(m[1]), []))
        elif cell.cell_type == "markdown" and re.search(r"^## Recap", cell.source, re.M):
            groups.append((None, []))
        groups[-1][1].append(cell)
    return groups


def problems(path: Path = MANIFEST, notebooks: Path = paths.NOTEBOOKS) -> list[str]:
    """What is wrong with the routes: a missing field, a step that names no notebook or a section it lacks."""
    out = []
    for name, route in load(path).items():
        for key in ("title", "for_whom", "steps"):
            if not route.get(key):
                out.append(f"path {name}: {key} missing")
        for text in route.get("steps", []):
            try:
                step = Step.parse(text)
            except ValueError as e:
                out.append(f"path {name}: {e}")
                continue
            nb = step.notebook(notebooks)
            if nb is None:
                out.append(f"path {name}: no notebook {step.prefix}_*.ipynb")
                continue
            have = {n for n, _ in _sections_of(nb) if n is not None}
            out += [f"path {name}: {nb.stem} has no section {s}" for s in step.sections if s not in have]
    return out


def step_minutes(step: Step, led: bool = False) -> int:
    """Minutes for one step: alone, the notebook's reading of the chosen parts, their exercises and the notebook's
    run; led, its workshop slot (the whole notebook's, scaled by the share of its exercises and reading kept)."""
    from course_utils.tooling import instructors, manifest

    nb = step.notebook()
    seconds = manifest.entry(nb.stem)["full_seconds"]
    if not step.sections:
        if led:
            return instructors.slot_minutes(seconds, study_time.exercises(nb))
        return study_time.alone_minutes(nb, seconds)
    kept = [c for n, cells in _sections_of(nb) if n is None or n in step.sections for c in cells]
    reading = study_time.cells_reading_minutes(kept)
    exercises = sum(1 for c in kept if study_time.is_solution_cell(c))
    if led:
        return instructors.slot_minutes(seconds, exercises)
    return study_time.minutes_alone(reading, exercises, seconds)


def hours(minutes: int) -> str:
    return f"{minutes // 60} h {minutes % 60:02d} min"


def table(path: Path = MANIFEST) -> str:
    lines = ["| path | for | notebooks (§ = only those sections) | about |", "|---|---|---|---|"]
    every = sorted(paths.NOTEBOOKS.glob("*.ipynb"))
    whole = sum(step_minutes(Step(nb.stem[:2])) for nb in every)
    lines.append(f"| **The whole course** | every notebook, in order | {every[0].stem[:2]}–{every[-1].stem[:2]} | "
                 f"{hours(whole)} on your own |")
    for route in load(path).values():
        steps = [Step.parse(s) for s in route["steps"]]
        led = bool(route.get("led"))
        total = sum(step_minutes(s, led) for s in steps)
        how = "in workshop slots" if led else "on your own"
        lines.append(f"| **{route['title']}** | {route['for_whom']} | {', '.join(map(str, steps))} | "
                     f"{hours(total)} {how} |")
    return "\n".join(lines)
