"""Execute the course: every notebook with papermill, HTML with nbconvert, and build/report.md.

``make course`` runs ``python -m course_utils.course run``. A failing notebook is reported with its
failing cell and the run goes on with the rest; the exit status is non-zero if any failed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import paths
from .nbtools import notebooks

CELL_TIMEOUT = 1800   # seconds one cell may run; every launch inside has its own, shorter timeout


@dataclass
class Outcome:
    name: str
    ok: bool
    seconds: float
    output: Path
    error: str = ""
    metrics: dict = field(default_factory=dict)


def execute(notebook: Path, output: Path, parameters: dict | None = None,
            cell_timeout: int = CELL_TIMEOUT, cwd: Path | None = None) -> Outcome:
    """Run one notebook with papermill (in its folder, or ``cwd``, with the course kernel)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    output.parent.mkdir(parents=True, exist_ok=True)
    metrics_file = paths.metrics_dir() / f"{notebook.stem}.json"
    metrics_file.unlink(missing_ok=True)     # the report shows this run's figures only, never stale ones
    started = time.monotonic()
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
    return Outcome(notebook.stem, not error, time.monotonic() - started, output, error, metrics)


def to_html(executed: Path, html_dir: Path) -> None:
    from nbconvert import HTMLExporter

    html_dir.mkdir(parents=True, exist_ok=True)
    body, _ = HTMLExporter().from_filename(str(executed))
    (html_dir / f"{executed.stem}.html").write_text(body)


def _figure(value: object, width: int = 70) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def report(outcomes: list[Outcome]) -> str:
    lines = ["# DeepSpeed course — run report", "",
             f"{sum(o.ok for o in outcomes)}/{len(outcomes)} notebooks passed.", "",
             "| notebook | status | wall time |", "|---|---|---|"]
    lines += [f"| {o.name} | {'ok' if o.ok else 'FAILED'} | {o.seconds:.0f} s |" for o in outcomes]
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


def run(selected: list[str] | None = None, smoke: bool = False) -> int:
    build = paths.build_dir()
    chosen = [nb for nb in notebooks() if not selected or any(nb.stem.startswith(s) for s in selected)]
    outcomes = []
    for nb in chosen:
        print(f"▶ {nb.stem} ...", flush=True)
        o = execute(nb, build / "executed" / nb.name, {"SMOKE": True} if smoke else None)
        try:
            to_html(o.output, build / "html")
        except Exception as e:  # a notebook that failed early may not render; the report still says why
            print(f"  (no HTML: {e})")
        print(f"  {'ok' if o.ok else 'FAILED ' + o.error.splitlines()[0][:200]} in {o.seconds:.0f} s", flush=True)
        outcomes.append(o)
    (build / "report.md").write_text(report(outcomes))
    print(f"Report: {paths.relative(build / 'report.md')}; executed notebooks in {paths.relative(build / 'executed')}/, "
          f"HTML in {paths.relative(build / 'html')}/")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 00 03")
    parser.add_argument("--smoke", action="store_true", default=os.environ.get("COURSE_SMOKE") == "1",
                        help="run with SMOKE=True (the test parameters)")
    a = parser.parse_args()
    sys.exit(run(a.only, a.smoke))
