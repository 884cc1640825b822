"""The course's manifest (``notebooks/manifest.toml``): each notebook's facts in one place.

The course runner reads which notebooks run alone and the time to expect of each, the tests their smoke times,
INSTRUCTORS.md's timing table and the README's notebook table are made from it, and ``make instructors`` writes a
full run's times into it. Adding a notebook means: the notebook, its script(s), its entry here, and a test for
what the generic checks cannot see. ``python -m course_utils.tooling.manifest`` checks the manifest against the notebooks
(``--write``: rewrites the two tables from it).
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

from course_utils.common import paths

MANIFEST = paths.NOTEBOOKS / "manifest.toml"
README = paths.ROOT / "README.md"
REQUIRED = {"title": str, "what_you_do": str, "ranks": int, "smoke_seconds": int, "full_seconds": int,
            "full_beside": bool}
OPTIONAL = {"services": list, "runs_alone": str, "student_parameters": dict}
README_BEGIN = "<!-- notebook table: written by `python -m course_utils.tooling.tables --write` from notebooks/manifest.toml -->"
README_END = "<!-- end of notebook table -->"


def load(path: Path = MANIFEST) -> dict[str, dict]:
    """notebook stem → its entry, in course order."""
    with path.open("rb") as f:
        return dict(sorted(tomllib.load(f).get("notebook", {}).items()))


def entry(stem: str, path: Path = MANIFEST) -> dict:
    """One notebook's entry; a clear error when it has none."""
    entries = load(path)
    if stem not in entries:
        raise KeyError(f"{stem} has no entry in {paths.relative(path)}: add one (see the other entries)")
    return entries[stem]


def problems(path: Path = MANIFEST, notebooks: Path = paths.NOTEBOOKS) -> list[str]:
    """What is wrong between the manifest and the notebooks: a notebook without an entry, an entry without a
    notebook, a missing or mistyped field, an unknown one."""
    entries, stems = load(path), sorted(nb.stem for nb in notebooks.glob("*.ipynb"))
    out = [f"{s}: no entry in {path.name}" for s in stems if s not in entries]
    out += [f"{s}: an entry in {path.name} but no notebook" for s in entries if s not in stems]
    for stem, e in entries.items():
        for key, kind in REQUIRED.items():
            if not isinstance(e.get(key), kind):
                out.append(f"{stem}: {key} missing or not {kind.__name__}")
        for key in set(e) - set(REQUIRED) - set(OPTIONAL):
            out.append(f"{stem}: unknown field {key!r}")
    from course_utils.tooling import routes
    return out + routes.problems(path, notebooks)


def smoke_seconds(path: Path = MANIFEST) -> dict[str, int]:
    """Two-digit prefix → the notebook's smoke-test seconds (ordering ``make test``'s workers)."""
    return {stem[:2]: e["smoke_seconds"] for stem, e in load(path).items()}


def full_seconds(path: Path = MANIFEST) -> dict[str, float]:
    """Notebook stem → its time in the last full run that ``make instructors`` recorded."""
    return {stem: float(e["full_seconds"]) for stem, e in load(path).items()}


def runs_alone(stem: str, path: Path = MANIFEST) -> str:
    """Why ``stem`` must run with nothing beside it in ``make course``, or ""."""
    return load(path).get(stem, {}).get("runs_alone", "")


def full_rows(path: Path = MANIFEST) -> list[dict]:
    """The recorded full run, in the form of a report's rows (:func:`course_utils.tooling.instructors.report_rows`)."""
    return [{"notebook": stem, "ok": True, "seconds": e["full_seconds"], "beside": ["?"] if e["full_beside"] else []}
            for stem, e in load(path).items()]


def record_full_run(rows: list[dict], path: Path = MANIFEST) -> bool:
    """Write a full run's times (rows of a report) into the manifest, its comments kept; True when it changed."""
    text = new = path.read_text()
    for r in rows:
        head = re.search(rf"^\[notebook\.{re.escape(r['notebook'])}\]$", new, re.M)
        if head is None:
            raise KeyError(f"{r['notebook']} has no entry in {paths.relative(path)}: add one first")
        nxt = re.search(r"^\[", new[head.end():], re.M)
        end = head.end() + nxt.start() if nxt else len(new)
        section = re.sub(r"^full_seconds = \d+$", f"full_seconds = {r['seconds']}", new[head.end():end], flags=re.M)
        section = re.sub(r"^full_beside = \w+$", f"full_beside = {'true' if r['beside'] else 'false'}", section,
                         flags=re.M)
        new = new[:head.end()] + section + new[end:]
    if new != text:
        path.write_text(new)
    return new != text


def readme_table(path: Path = MANIFEST) -> str:
    lines = ["| # | notebook | what you do |", "|---|---|---|"]
    lines += [f"| {stem[:2]} | {e['title']} | {e['what_you_do']} |" for stem, e in load(path).items()]
    return "\n".join(lines)


def between(text: str, begin: str, end: str, table: str, where: str) -> str:
    """``text`` with what lies between its two markers replaced by ``table``."""
    if begin not in text or end not in text:
        raise ValueError(f"{where} lacks its table markers ({begin!r} … {end!r})")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    wrong = problems()
    for line in wrong:
        print(f"manifest: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
