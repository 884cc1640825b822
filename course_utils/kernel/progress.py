"""Where a long run is and how long is left: set-up steps, op builds, the notebooks of ``make course``.

In a terminal a live bar (tqdm, already a dependency of the venv's stack) sits under the lines; in CI and logs
(no terminal, or ``CI`` set) there are plain lines only. Standard library otherwise: set-up runs this before the
venv has its packages (``python -m course_utils.kernel.progress step ...``), when the bar is simply left out.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

from course_utils.common import paths


def live() -> bool:
    """Whether to draw a live bar: a terminal, not CI, and tqdm importable."""
    if os.environ.get("CI") or not sys.stdout.isatty():
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def minutes(seconds: float) -> str:
    """``"40 s"``, ``"3 min"``: how a learner reads an estimate (rounded up to 10 s under 2 min, else to the nearest
    minute: rounding 2 min 10 s up to "3 min" would announce 40 % more than it is)."""
    if seconds < 120:
        return f"{max(10, -(-int(seconds) // 10) * 10)} s"
    return f"{int(seconds / 60 + 0.5)} min"


def clock(seconds: float) -> str:
    """Elapsed time as ``"4 min 05 s"``."""
    s = int(seconds)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def say(line: str) -> None:
    """Print a line above a live bar (or plainly)."""
    if live():
        from tqdm import tqdm
        tqdm.write(line)
        sys.stdout.flush()
    else:
        print(line, flush=True)


@contextlib.contextmanager
def timed(label: str, estimate: float, left: float | None = None) -> Iterator[None]:
    """One opaque step (a compile, an install): its line with the estimate, and in a terminal a bar of the time
    elapsed against the estimate until it is done."""
    say(f"{label} — about {minutes(estimate if left is None else left)} left")
    if not live():
        yield
        return
    from tqdm import tqdm

    done = threading.Event()
    bar = tqdm(total=int(estimate), leave=False, bar_format="  {bar:30} {elapsed} of about " + minutes(estimate))

    def tick() -> None:
        started = time.monotonic()
        while not done.wait(1):
            bar.n = min(int(time.monotonic() - started), int(estimate) - 1)
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()


class CourseBar:
    """``make course``'s progress: a bar of notebooks done (terminal) and the "n of N" lines (always)."""

    def __init__(self, total: int):
        self.total, self.started = total, time.monotonic()
        self.bar = None
        if live():
            from tqdm import tqdm
            self.bar = tqdm(total=total, bar_format="{desc} {bar:20} {n}/{total} notebooks{postfix}")
            self.bar.set_description_str("course")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def status(self, left: float) -> str:
        return f"{clock(self.elapsed())} elapsed" + (f", about {minutes(left)} left" if left > 0 else "")

    def tick(self, left: float) -> None:
        """Refresh the bar's clock (every poll of the run loop)."""
        if self.bar is not None:
            self.bar.set_postfix_str(self.status(left), refresh=True)

    def done(self, n: int, line: str, left: float) -> None:
        say(f"{line} · {n} of {self.total} done, {self.status(left)}")
        if self.bar is not None:
            self.bar.n = n
            self.tick(left)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RunPace:
    """How fast this machine runs the notebooks: the notebooks of this run that finished well, their time over what was
    expected of each (its recorded time, times the op build's share where one ran beside; 1.0 before the first). The
    estimates of those still to come are scaled by it, so that a machine faster or slower than the one that recorded
    the manifest's ``full_seconds`` (machines differ by up to 2x) is announced its own times from the third notebook
    on. Kept within [LOW, HIGH], and a notebook that failed is not counted."""

    LOW, HIGH = 0.4, 2.5

    def __init__(self) -> None:
        self.expected, self.took = 0.0, 0.0

    @property
    def factor(self) -> float:
        return min(self.HIGH, max(self.LOW, self.took / self.expected)) if self.expected else 1.0

    def add(self, expected: float, took: float) -> None:
        self.expected, self.took = self.expected + expected, self.took + took

    def line(self, told: float) -> str | None:
        """A line when the factor has moved by a fifth or more from ``told`` (the factor last said), else None."""
        if abs(self.factor / told - 1) < 0.2:
            return None
        return (f"  (the notebooks have taken {self.factor:.2f} × their expected times on this machine so far: the "
                "estimates from here on count with it)")


def left_seconds(waiting: list[str], running: Mapping[str, float], estimate: Mapping[str, float],
                 alone: set[str], lanes: int) -> float:
    """Seconds until the run ends: notebooks that share the cores (waiting, and the rest of those running) divided
    over the lanes, plus those that run alone one after another. ``running``: notebook → seconds it has run."""
    def rest(name: str) -> float:      # one that runs past its estimate still has a little left
        expected = estimate.get(name, 60.0)
        return max(0.1 * expected, expected - running[name]) if name in running else expected

    names = list(waiting) + list(running)
    shared = sum(rest(n) for n in names if n not in alone)
    return shared / max(1, lanes) + sum(rest(n) for n in names if n in alone)


# The set-up steps of the Makefile, with their time on a fresh 2-core machine (measured 2026-11-25).
# The system packages (apt: libaio-dev, pdsh and OpenSSH, Slurm, munge and Open MPI, about 55 s) install beside pip
# (``step --beside``): neither waits for the other, so the first notebook starts sooner.
SETUP_STEPS = {"packages": ("the pinned packages (pip), beside them the system ones (apt)", 95),
               "kernel": ("the Jupyter kernel", 5), "ops": ("DeepSpeed's ops for the first notebooks", 35)}
BESIDE_LIMIT = 900      # seconds a step waits for the command beside it after its own (apt on a slow mirror)
SETUP_LOG = "setup.log"


def _setup_started(log: Path, first: bool) -> float:
    if first or not log.exists():
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"# set-up started {time.time():.0f}\n")
    m = re.match(r"# set-up started (\d+)", log.read_text()[:100])
    return float(m[1]) if m else time.time()


@contextlib.contextmanager
def _beside(command: list[str] | None, log: Path) -> Iterator[Callable[[], tuple[int, str]]]:
    """Run ``command`` in a session of its own while the step's own command runs; the block gets a function that
    waits for it (up to BESIDE_LIMIT) and returns its exit status and output. Whatever ends the block (a failure,
    Ctrl-C), the command and everything it started are ended with it: nothing of set-up outlives set-up."""
    if not command:
        yield lambda: (0, "")
        return
    output = log.with_name(f".{log.name}.beside")
    with output.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def finished() -> tuple[int, str]:
        try:
            code = proc.wait(timeout=BESIDE_LIMIT)
        except subprocess.TimeoutExpired:
            code = 124
        return code, output.read_text(errors="replace") + (
            f"\n{' '.join(command)} ran past {BESIDE_LIMIT} s and was stopped\n" if code == 124 else "")
    try:
        yield finished
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        output.unlink(missing_ok=True)


def step(name: str, command: list[str], log: Path, show: bool = False, beside: list[str] | None = None) -> int:
    """Run one set-up step: its line (n of N, estimate), its output into ``log``, then how long it took and how
    long set-up has left. Lines starting with ``NOTE`` (what the learner must do, from ``.ci/install-*``) are
    shown; on a failure, the end of the output. ``show``: the command's standard output is for the learner (it
    says its own progress); only its standard error goes to the log. ``beside``: a second command run at the same
    time (its output counts as the step's, after the step's own); the step ends when both have."""
    names = list(SETUP_STEPS)
    n = names.index(name) + 1
    started_setup = _setup_started(log, n == 1)
    label, estimate = SETUP_STEPS[name]
    header = f"set-up {n} of {len(names)}: {label}"
    started = time.monotonic()
    with log.open("a") as out, _beside(beside, log) as beside_finished:
        out.write(f"\n# step {n}: {' '.join(command)}\n" + (f"# beside it: {' '.join(beside)}\n" if beside else ""))
        out.flush()
        if show:
            say(f"{header} — about {minutes(sum(SETUP_STEPS[s][1] for s in names[n - 1:]))} left")
            proc = subprocess.run(command, stderr=out)
            beside_code, text = beside_finished()
        else:
            with timed(header, estimate, sum(SETUP_STEPS[s][1] for s in names[n - 1:])):
                proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      errors="replace")
                beside_code, beside_text = beside_finished()
            text = proc.stdout + beside_text
        out.write(text)
        if proc.returncode == 0 and beside_code != 0:
            proc.returncode = beside_code
    note = False
    for line in text.splitlines():
        note = line.startswith("NOTE") or (note and line.startswith(" ") and line.strip() != "")
        if note:
            say(line)
    if proc.returncode != 0:
        tail = text.splitlines()[-30:] if text else log.read_text().splitlines()[-30:]
        say("\n".join(tail))
        say(f"set-up {n} of {len(names)} FAILED (exit {proc.returncode}); full output: {paths.relative(log)}")
        return proc.returncode
    rest = sum(SETUP_STEPS[s][1] for s in names[n:])
    say(f"  done in {clock(time.monotonic() - started)} (set-up {clock(time.time() - started_setup)} so far"
        + (f", about {minutes(rest)} left" if rest else "") + f"; output in {paths.relative(log)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("step", help="run one set-up step: python -m course_utils.kernel.progress step NAME [--show] -- COMMAND...")
    s.add_argument("name", choices=list(SETUP_STEPS))
    s.add_argument("--show", action="store_true", help="the command's output is for the learner")
    s.add_argument("--beside", help="a second command (one string) run at the same time as COMMAND")
    a = parser.parse_args(ours)
    if not command:
        parser.error("no command after --")
    if a.show and a.beside:
        parser.error("--beside needs the step's output (not --show)")
    return step(a.name, command, paths.build_dir() / SETUP_LOG, a.show, shlex.split(a.beside) if a.beside else None)


if __name__ == "__main__":
    sys.exit(main())
