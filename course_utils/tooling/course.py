"""Execute the course: every notebook with papermill, HTML with nbconvert, and build/report.md.

``make course`` runs ``python -m course_utils.tooling.course run``. A failing notebook is reported with its
failing cell and the run goes on with the rest; the exit status is non-zero if any failed.

Notebooks run two at a time (``--lanes``), each in its own kernel and its own ranks, except those whose
manifest entry (``notebooks/manifest.toml``) says ``runs_alone = "<why>"``: their figures compare timings (step times, training
times), which a neighbour would distort, so they run when nothing else does. The others start longest
first, by the previous ``build/report.md``, so the two lanes end together. The report names the notebooks
that ran side by side; ``--lanes 1`` runs one at a time, for per-notebook timings.

DeepSpeed ops that set-up left out build in the background meanwhile (:mod:`course_utils.kernel.opbuild`): a notebook
starts once the ops it loads are built (one that runs alone, once all are), another one ready takes its lane. The
console says "notebook n of N", the time elapsed and about how long is left, from the previous report's times or
else the manifest's (:mod:`course_utils.kernel.progress`); each kernel's own output goes to a log beside the notebook.
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
from typing import Callable, Container

from course_utils.common import paths
from course_utils.tooling.nbtools import select

CELL_TIMEOUT = 1800   # seconds one cell may run; every launch inside has its own, shorter timeout
# The kernel's connection encrypted with CurveZMQ keys the kernel manager provisions (the course kernelspec declares
# "supported_encryption": ["curve"]); unencrypted, every kernel warns "Kernel is running over TCP without encryption".
ENCRYPTED = {"transport_encryption": "auto"}
# Seconds a kernel has to end after papermill asks it to (at the notebook's end, or at its first failing cell): half of
# it before SIGTERM, the rest before SIGKILL. jupyter_client's 5 s cut short the kernel's own clean-up at exit, a Slurm
# cluster's stop (scancel, then its processes ended: about 3 s, up to 20), and what it had started outlived the
# notebook, left to its watchdog. A kernel that ends sooner is not waited for.
SHUTDOWN_WAIT = 40.0


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
    import zmq
    from papermill.exceptions import PapermillExecutionError
    from traitlets.config import Config

    output.parent.mkdir(parents=True, exist_ok=True)
    metrics_file = paths.metrics_dir() / f"{notebook.stem}.json"
    metrics_file.unlink(missing_ok=True)     # the report shows this run's figures only, never stale ones
    started, wall_started = time.monotonic(), time.time()
    error = ""
    try:
        papermill.execute_notebook(str(notebook), str(output), parameters=parameters or {},
                                   cwd=str(cwd or notebook.parent), execution_timeout=cell_timeout,
                                   progress_bar=False, log_output=False,
                                   config=Config({"KernelManager": {"shutdown_wait_time": SHUTDOWN_WAIT,
                                                                     **(ENCRYPTED if zmq.has("curve") else {})}}))
    except PapermillExecutionError as e:
        error = f"cell {e.exec_count}: {e.ename}: {e.evalue}".strip()
    except Exception as e:  # a dead kernel, a timeout: reported, and the course goes on
        error = f"{type(e).__name__}: {e}"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    return Outcome(notebook.stem, not error, time.monotonic() - started, output, error, metrics,
                   wall_started, time.time())


def to_html(executed: Path, html_dir: Path) -> None:
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import TagRemovePreprocessor
    from course_utils.tooling.study_time import RECORD_TAG

    html_dir.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()        # the cells that only record the run's figures stay out of sight, as in JupyterLab
    exporter.register_preprocessor(TagRemovePreprocessor(remove_input_tags={RECORD_TAG}, enabled=True), enabled=True)
    body, _ = exporter.from_filename(str(executed))
    (html_dir / f"{executed.stem}.html").write_text(body)


def _figure(value: object, width: int = 70) -> str:
    text = json.dumps(value)
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    return (cut[: cut.rfind(" ")] if " " in cut[width // 2:] else cut) + "…"     # at a word's end where one is near


BUILD = "the op build"      # in a report's "ran beside" column: DeepSpeed's ops were building while it ran


def beside(o: Outcome, outcomes: list[Outcome], build_until: float = 0.0) -> list[str]:
    """The notebooks that ran while ``o`` ran, and :data:`BUILD` when it started before ``build_until`` (time.time()
    when the background op build was last seen running)."""
    return [b.name for b in outcomes if b is not o and b.started < o.ended and o.started < b.ended] + \
        ([BUILD] if o.started < build_until else [])


def runs_alone(notebook: Path) -> str:
    """Why ``notebook`` must run with nothing beside it (its manifest entry's ``runs_alone``), or ""."""
    from course_utils.tooling import manifest

    return manifest.runs_alone(notebook.stem)


def previous_seconds(report: Path) -> dict[str, float]:
    """Each notebook's wall time in an earlier ``report.md`` (empty when there is none); one that ran beside the op
    build, as without it (its time over :data:`course_utils.kernel.ops.NOTEBOOKS_BESIDE_BUILD`)."""
    import re
    from course_utils.kernel.ops import NOTEBOOKS_BESIDE_BUILD

    if not report.exists():
        return {}
    rows = re.findall(r"^\| (\S+) \| [A-Za-z]+ \| (\d+) s \| (.*) \|$", report.read_text(), re.M)
    return {name: float(seconds) / (NOTEBOOKS_BESIDE_BUILD if BUILD in ran_beside else 1.0)
            for name, seconds, ran_beside in rows}


def lane_order(chosen: list[Path], alone: Container[Path], seconds: dict[str, float]) -> list[Path]:
    """The order notebooks start in: those that may share the cores first, longest first by an earlier run
    (notebooks it did not time come first, in course order), then those that must run alone."""
    shared = sorted((nb for nb in chosen if nb not in alone), key=lambda nb: -seconds.get(nb.stem, float("inf")))
    return shared + [nb for nb in chosen if nb in alone]


def may_start(notebook: Path, running: list[Path], alone: Container[Path], lanes: int) -> bool:
    """Whether ``notebook`` may start now: a lane is free, and neither it nor a running one must run alone."""
    return len(running) < lanes and not (running and (notebook in alone or any(nb in alone for nb in running)))


SMOKE_NOTE = "Smoke parameters (the tests' settings): these times are not the course's."


def report(outcomes: list[Outcome], smoke: bool = False, build_until: float = 0.0) -> str:
    lines = ["# DeepSpeed course — run report", "",
             f"{sum(o.ok for o in outcomes)}/{len(outcomes)} notebooks passed.", "",
             *([SMOKE_NOTE, ""] if smoke else []),
             "| notebook | status | wall time | ran beside |", "|---|---|---|---|"]
    lines += [f"| {o.name} | {'ok' if o.ok else 'FAILED'} | {o.seconds:.0f} s | {', '.join(beside(o, outcomes, build_until)) or '—'} |"
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


def kernel_log(notebook: Path) -> Path:
    """Where the kernel's own output goes in ``make course``: ipykernel's log lines and what the kernel process and
    the programs it starts write straight to its stdout and stderr, outside any cell (each cell's output is in the
    executed notebook)."""
    return paths.build_dir() / "executed" / f"{notebook.stem}.kernel.log"


def _run_one(notebook: Path, smoke: bool) -> Outcome:
    """Execute one notebook and render its HTML (in a worker process of :func:`run`; the kernel it starts
    inherits this process's stdout and stderr, which go to :func:`kernel_log`)."""
    from course_utils.kernel.opbuild import NOTEBOOK_ENV

    os.environ[NOTEBOOK_ENV] = notebook.stem      # a launch of a script without a notebook prefix waits for its ops
    log = kernel_log(notebook)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:          # the kernel and what it starts inherit both
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    o = execute(notebook, paths.build_dir() / "executed" / notebook.name, {"SMOKE": True} if smoke else None)
    if not o.ok:       # the first line is what the report and the console show
        first, _, rest = o.error.partition("\n")
        o.error = f"{first} (kernel log: {paths.relative(log)})" + (f"\n{rest}" if rest else "")
    try:
        to_html(o.output, paths.build_dir() / "html")
    except Exception as e:  # a notebook that failed early may not render; the report still says why
        print(f"  ({o.name}: no HTML: {e})", flush=True)
    return o


def next_notebook(queue: list[Path], running: list[Path], alone: Container[Path], lanes: int,
                  blocked: Callable[[Path], list]) -> Path | None:
    """The first notebook of ``queue`` that may start now: a lane is free (:func:`may_start`) and no op it loads is
    still building (``blocked(notebook)`` is empty); None when none may."""
    return next((nb for nb in queue if may_start(nb, running, alone, lanes) and not blocked(nb)), None)


def run(selected: list[str] | None = None, smoke: bool = False, lanes: int = 2) -> int:
    from course_utils.tooling import manifest
    from course_utils.kernel import opbuild, ops, progress

    build = paths.build_dir()
    chosen = select(selected)
    alone = {nb: why for nb in chosen if lanes > 1 and (why := runs_alone(nb))}   # notebook → why it runs alone
    earlier = previous_seconds(build / "report.md")
    queue = lane_order(chosen, alone, earlier)
    estimate = {**manifest.full_seconds(), **earlier}     # the manifest's recorded run, then this machine's
    outcomes: list[Outcome] = []
    bar = progress.CourseBar(len(chosen))
    pace, pace_told = progress.RunPace(), 1.0      # this machine's pace against the expected times, learnt as it goes
    build_until = 0.0                               # time.time() when the background op build was last seen running
    builder, state, told, said = opbuild.start([nb.stem for nb in queue]), opbuild.read_state(), set(), {}
    progress.say(f"{len(chosen)} notebooks, {lanes} at a time; each kernel's own log (outside its cells) goes to "
                 f"{paths.relative(build / 'executed')}/<notebook>.kernel.log")

    def blocked(nb: Path, pace: float | None = None) -> list:   # one that runs alone compares timings: no compile beside
        loads = ops.course_ops() if nb in alone else ops.for_script(nb.stem)
        return opbuild.pending([op.key for op in loads], state, pace)

    def left(running: dict) -> float:
        now = time.monotonic()
        return progress.left_seconds([nb.stem for nb in queue], {nb.stem: now - t for nb, t, _ in running.values()},
                                     {k: v * pace.factor for k, v in estimate.items()}, {nb.stem for nb in alone}, lanes)
    try:
        with ProcessPoolExecutor(max(1, lanes), mp_context=multiprocessing.get_context("spawn")) as pool:
            running: dict = {}      # future → (notebook, when it started, the time expected of it before the pace)
            while queue or running:
                state = opbuild.read_state()
                if state is not None:
                    build_until = time.time()
                for line in opbuild.news(said, opbuild.raw_state() if builder else None):
                    progress.say(line)
                while (nb := next_notebook(queue, [n for n, *_ in running.values()], alone, lanes, blocked)) is not None:
                    queue.remove(nb)
                    beside_build = ops.NOTEBOOKS_BESIDE_BUILD if state is not None else 1.0   # compilers share the cores
                    expected = beside_build * estimate.get(nb.stem, 60)
                    progress.say(f"▶ notebook {len(chosen) - len(queue)} of {len(chosen)}: {nb.stem} (about "
                                 f"{progress.minutes(expected * pace.factor)}"
                                 + (", beside the op build" if state is not None else "") + ")"
                                 + (f" — alone: {alone[nb]}" if nb in alone else ""))
                    running[pool.submit(_run_one, nb, smoke)] = (nb, time.monotonic(), expected)
                if queue and queue[0] not in told and len(running) < lanes and (waits := blocked(queue[0])):
                    told.add(queue[0])      # its lane is free now: the compilers' pace from now on, not so far
                    progress.say(opbuild.waiting_line(queue[0].stem, blocked(queue[0], opbuild.recent_pace()) or waits))
                bar.tick(left(running))
                if not running:
                    time.sleep(1)
                    continue
                done, _ = wait(running, timeout=2, return_when=FIRST_COMPLETED)
                for future in done:
                    nb, _, expected = running.pop(future)
                    try:
                        o = future.result()
                    except Exception as e:     # the worker process itself died: reported, and the course goes on
                        o = Outcome(nb.stem, False, 0.0, build / "executed" / nb.name, f"{type(e).__name__}: {e}")
                    outcomes.append(o)
                    if o.ok:
                        pace.add(expected, o.seconds)
                    status = "ok" if o.ok else "FAILED " + o.error.splitlines()[0][:200]
                    bar.done(len(outcomes), f"  {o.name}: {status} in {o.seconds:.0f} s", left(running))
                    if queue and (line := pace.line(pace_told)):
                        progress.say(line)
                        pace_told = pace.factor
    finally:
        bar.close()
        if opbuild.stop(builder):
            progress.say("The background op build stopped before it finished; the next `make course` goes on with it.")
    outcomes.sort(key=lambda o: o.name)
    (build / "report.md").write_text(report(outcomes, smoke, build_until))
    if not selected and not smoke and all(o.ok for o in outcomes):     # a full run: the guide's timings, under build/
        from course_utils.tooling import instructors
        if instructors.write_table(build / "report.md"):
            print("INSTRUCTORS.md's timing table differs from this run: `make instructors` records this run's times in the manifest and the table")
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
