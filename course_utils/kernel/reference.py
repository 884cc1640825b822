"""The figures a notebook quotes from a real GPU: ``make gpu-check``'s committed runs, ``reference/gpu/<date>-<gpu>/``.

A learner on a laptop sees the CPU's figures; beside them a notebook can set what the same cell measured on a GPU,
with the machine, the date and the commit it ran, or say plainly that no GPU has run it yet. Only a real GPU's run
counts: a folder whose ``run.json`` says ``described`` (the course was told it was on a GPU machine while its ranks
computed on the CPU, ``COURSE_MACHINE``) is never read, nor a notebook that did not pass in its run. A run missing
the figure asked for gives way to an older one that has it.

Standard library only: ``make gpu-check`` orders its notebooks with it (:func:`last_passed`) before it has installed
anything.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from course_utils.common import paths

PASSED = "passed"
RUN, NOTEBOOKS, METRICS = "run.json", "notebooks.json", "metrics"


@dataclass(frozen=True)
class Run:
    """One real GPU run: its folder and what its ``run.json`` and ``notebooks.json`` say."""
    folder: Path
    gpu: str               # "NVIDIA H200", or "2 × NVIDIA H200"
    date: str              # YYYY-MM-DD (UTC)
    started: str           # ISO time (UTC): orders two runs of one day
    commit: str            # short commit, "-dirty" when the tree had changes, "unknown" without git
    statuses: dict         # notebook stem → its status in this run

    def passed(self, stem: str) -> bool:
        return self.statuses.get(stem) == PASSED

    def metrics(self, stem: str) -> dict:
        path = self.folder / METRICS / f"{stem}.json"
        return _read(path) if path.exists() else {}


@dataclass(frozen=True)
class Reference:
    """One figure of a real GPU run."""
    value: object
    gpu: str
    date: str
    commit: str
    folder: Path


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{paths.relative(path)} is not readable JSON ({e}): restore it from git, or remove its "
                         f"run's folder") from None


def short_commit(info: dict) -> str:
    """``run.json``'s commit as a reader quotes it: 7 characters, ``-dirty`` when the tree had changes."""
    commit = info.get("commit")
    if not commit:
        return "unknown"
    return commit[:7] + ("-dirty" if info.get("dirty") else "")


def gpu_words(info: dict) -> str:
    count, name = int(info.get("gpu_count") or 1), info.get("gpu") or "unknown GPU"
    return name if count == 1 else f"{count} × {name}"


def runs(root: Path | None = None) -> list[Run]:
    """The real GPU runs under ``root`` (``reference/gpu/``), oldest first; a described run is not one."""
    root = paths.reference_dir() if root is None else root
    found = []
    for folder in sorted(p for p in root.glob("*") if (p / RUN).is_file()):
        info = _read(folder / RUN)
        if info.get("described") is not False:        # described, or a run.json that does not say: never quoted
            continue
        listed = _read(folder / NOTEBOOKS) if (folder / NOTEBOOKS).exists() else {"notebooks": []}
        statuses = {n["notebook"]: n["status"] for n in listed.get("notebooks", [])}
        found.append(Run(folder, gpu_words(info), info.get("date", ""), info.get("started", ""), short_commit(info),
                         statuses))
    return sorted(found, key=lambda r: (r.date, r.started, r.folder.name))


def last_passed(root: Path | None = None) -> dict[str, str]:
    """Notebook stem → when its latest passing real GPU run started (notebooks that never passed are absent)."""
    return {stem: run.started for run in runs(root) for stem in run.statuses if run.passed(stem)}


def latest(stem: str, key: str, root: Path | None = None) -> Reference | None:
    """``key`` of notebook ``stem``'s recorded figures in the newest real GPU run where it passed and recorded it;
    None when no such run is committed."""
    for run in reversed(runs(root)):
        if run.passed(stem) and key in (figures := run.metrics(stem)):
            return Reference(figures[key], run.gpu, run.date, run.commit, run.folder)
    return None


def line(stem: str, key: str, label: str, fmt: str = "{}", root: Path | None = None) -> str:
    """One line for the notebook: ``"GPU reference run (<GPU>, <date>, commit <short>): <label> <value>"``, the value
    written with ``fmt`` (``"{:.1f} GiB"``), or ``"<label>: no GPU reference run yet"``."""
    ref = latest(stem, key, root)
    if ref is None:
        return f"{label}: no GPU reference run yet"
    return f"GPU reference run ({ref.gpu}, {ref.date}, commit {ref.commit}): {label} {fmt.format(ref.value)}"


def beside(stem: str, key: str, label: str, here: float, where: str, fmt: str = "{:.2f}×",
           projected: tuple[str, float] | None = None, root: Path | None = None) -> str:
    """A figure three ways, one line each: as this run measured it (``where``: the machine), as the latest committed
    GPU reference run recorded it under ``key`` (or "no GPU reference run yet"), and, when given, as a projection
    (``(what it projects, the value)``) labelled so."""
    lines = [f"this run ({where}): {label} {fmt.format(here)}", line(stem, key, label, fmt, root)]
    if projected is not None:
        lines.append(f"projected ({projected[0]}): {label} {fmt.format(projected[1])}")
    return "\n".join(lines)
