"""Execute the course: every notebook with papermill, HTML with nbconvert, and build/report.md.

``make course`` runs ``python -m course_utils.course run``. A failing notebook is reported with its
failing cell and the run goes on with the rest; the exit status is non-zero if any failed.

Notebooks run two at a time (``--lanes``), each in its own kernel and its own ranks, except those whose
metadata says ``"course": {"runs_alone": "<why>"}``: their figures compare timings (step times, training
times), which a neighbour would distort, so they run when nothing else does. The others start longest
first, by the previous ``build/report.md``, so the two lanes end together. The report names the notebooks
that ran side by side; ``--lanes 1`` runs one at a time, for per-notebook timings.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Container

from . import paths
from .nbtools import select

CELL_TIMEOUT = 1800   # seconds one cell may run; every launch inside has its own, shorter timeout


@dataclass
class Outcome:
    name: str
    ok: bool
    seconds: float
    output: Path
    error: str = ""
    metrics: dict = field(default_factory=dict)
    started: float = 0.0          # time.time() at the start and the end: which notebooks ran side by side
    ended: float = 0.0


def execute(notebook: Path, output: Path, parameters: dict | None = None,
            cell_timeout: int = CELL_TIMEOUT, cwd: Path | None = None) -> Outcome:
    """Run one notebook with papermill (in its folder, or ``cwd``, with the course kernel)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    output.parent.mkdir(parents=True, exist_ok=True)
    metrics_file = paths.metrics_dir() / f"{notebook.stem}.json"
    metrics_file.unlink(missing_ok=True)     # the report shows this run's figures only, never stale ones
    started, wall_started = time.monotonic(), time.time()
    error = ""
    try:
        papermill.execute_notebook(str(notebook), str(output), parameters=parameters or {},
                                   cwd=str(cwd or notebook.parent), execution_timeout=cell_timeout,
                                   progress_bar=False, log_output=False)
    except PapermillExecutionError as e:
        error = f"cell {e.exec_count}: {e.ename}: {e.evalue}".strip()
    except Exception as e:  # a dead kernel, a timeout: reported, and the course goes on
        error = f"{type(e).__name__}: {e}"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    return Outcome(notebook.stem, not error, time.monotonic() - started, output, error, metrics,
                   wall_started, time.time())


def to_html(executed: Path, html_dir: Path) -> None:
    from nbconvert import HTMLExporter

    html_dir.mkdir(parents=True, exist_ok=True)
    body, _ = HTMLExporter().from_filename(str(executed))
    (html_dir / f"{executed.stem}.html").write_text(body)


def _figure(value: object, width: int = 70) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def beside(o: Outcome, outcomes: list[Outcome]) -> list[str]:
    """The notebooks that ran while ``o`` ran."""
    return [b.name for b in outcomes if b is not o and b.started < o.ended and o.started < b.ended]


def runs_alone(notebook: Path) -> str:
    """Why ``notebook`` must run with nothing beside it (its metadata ``course.runs_alone``), or ""."""
    return json.loads(notebook.read_text()).get("metadata", {}).get("course", {}).get("runs_alone", "")


def previous_seconds(report: Path) -> dict[str, float]:
    """Each notebook's wall time in an earlier ``report.md`` (empty when there is none)."""
    import re

    if not report.exists():
        return {}
    rows = re.findall(r"^\| (\S+) \| [A-Za-z]+ \| (\d+) s \|", report.read_text(), re.M)
    return {name: float(seconds) for name, seconds in rows}


def lane_order(chosen: list[Path], alone: Container[Path], seconds: dict[str, float]) -> list[Path]:
    """The order notebooks start in: those that may share the cores first, longest first by an earlier run
    (notebooks it did not time come first, in course order), then those that must run alone."""
    shared = sorted((nb for nb in chosen if nb not in alone), key=lambda nb: -seconds.get(nb.stem, float("inf")))
    return shared + [nb for nb in chosen if nb in alone]


def may_start(notebook: Path, running: list[Path], alone: Container[Path], lanes: int) -> bool:
    """Whether ``notebook`` may start now: a lane is free, and neither it nor a running one must run alone."""
    return len(running) < lanes and not (running and (notebook in alone or any(nb in alone for nb in running)))


SMOKE_NOTE = "Smoke parameters (the tests' settings): these times are not the course's."


def report(outcomes: list[Outcome], smoke: bool = False) -> str:
    lines = ["# DeepSpeed course — run report", "",
             f"{sum(o.ok for o in outcomes)}/{len(outcomes)} notebooks passed.", "",
             *([SMOKE_NOTE, ""] if smoke else []),
             "| notebook | status | wall time | ran beside |", "|---|---|---|---|"]
    lines += [f"| {o.name} | {'ok' if o.ok else 'FAILED'} | {o.seconds:.0f} s | {', '.join(beside(o, outcomes)) or '—'} |"
              for o in outcomes]
    for o in outcomes:
        lines += ["", f"## {o.name}", ""]
        if o.error:
            lines += [f"**Failed** at {o.error.splitlines()[0][:300]}", ""]
        if o.metrics:
            lines += ["| figure | value |", "|---|---|"]
            lines += [f"| {k} | `{_figure(v)}` |" for k, v in sorted(o.metrics.items())]
        else:
            lines.append("No figures recorded.")
    return "\n".join(lines) + "\n"


def _run_one(notebook: Path, smoke: bool) -> Outcome:
    """Execute one notebook and render its HTML (in a worker process of :func:`run`)."""
    o = execute(notebook, paths.build_dir() / "executed" / notebook.name, {"SMOKE": True} if smoke else None)
    try:
        to_html(o.output, paths.build_dir() / "html")
    except Exception as e:  # a notebook that failed early may not render; the report still says why
        print(f"  ({o.name}: no HTML: {e})", flush=True)
    return o


def run(selected: list[str] | None = None, smoke: bool = False, lanes: int = 2) -> int:
    build = paths.build_dir()
    chosen = select(selected)
    alone = {nb: why for nb in chosen if lanes > 1 and (why := runs_alone(nb))}   # notebook → why it runs alone
    queue = lane_order(chosen, alone, previous_seconds(build / "report.md"))
    outcomes: list[Outcome] = []
    with ProcessPoolExecutor(max(1, lanes), mp_context=multiprocessing.get_context("spawn")) as pool:
        running: dict = {}
        while queue or running:
            while queue and may_start(queue[0], list(running.values()), alone, lanes):
                nb = queue.pop(0)
                print(f"▶ {nb.stem} ...{' (alone: ' + alone[nb] + ')' if nb in alone else ''}", flush=True)
                running[pool.submit(_run_one, nb, smoke)] = nb
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                nb = running.pop(future)
                try:
                    o = future.result()
                except Exception as e:     # the worker process itself died: reported, and the course goes on
                    o = Outcome(nb.stem, False, 0.0, build / "executed" / nb.name, f"{type(e).__name__}: {e}")
                print(f"  {o.name}: {'ok' if o.ok else 'FAILED ' + o.error.splitlines()[0][:200]} in {o.seconds:.0f} s",
                      flush=True)
                outcomes.append(o)
    outcomes.sort(key=lambda o: o.name)
    (build / "report.md").write_text(report(outcomes, smoke))
    if not selected and not smoke and all(o.ok for o in outcomes):     # a full run: INSTRUCTORS.md's timings follow it
        from . import instructors
        if instructors.update(build / "report.md"):
            print("INSTRUCTORS.md: timing table rewritten from this run")
    print(f"Report: {paths.relative(build / 'report.md')}; executed notebooks in {paths.relative(build / 'executed')}/, "
          f"HTML in {paths.relative(build / 'html')}/")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 00 03")
    parser.add_argument("--smoke", action="store_true", default=os.environ.get("COURSE_SMOKE") == "1",
                        help="run with SMOKE=True (the test parameters)")
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("COURSE_LANES", 2)),
                        help="notebooks run at the same time (1: one after another, for per-notebook timings)")
    a = parser.parse_args()
    sys.exit(run(a.only, a.smoke, a.lanes))
