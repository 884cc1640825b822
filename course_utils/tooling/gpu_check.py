"""``make gpu-check BUDGET=540 [WHEELHOUSE=dir]``: a GPU machine at hand for a few minutes, its evidence kept.

A GPU machine is at hand rarely and briefly (about 15 minutes, its start included, often with no network), and what
it measured is lost with it unless it is written down. This command spends a budget of seconds in the order that
teaches most, and writes ``reference/gpu/<date>-<gpu>/`` for committing, whatever happens (a failure, Ctrl-C):

1. the course's environment, only if this python lacks the course's packages: a virtual environment (``.venv``)
   over this python, its packages seen, so the image's CUDA torch is kept (the CPU pin is never installed over it),
   filled from a wheelhouse without network; then the kernelspec papermill runs the notebooks with, and a look at
   whether torch sees the GPUs (if not, nothing runs: a CPU's figures would be filed as a GPU's);
2. DeepSpeed's ops (``opbuild --build``), then ``make test-gpu``'s tests (junit: counts and each failure's text);
3. the notebooks: those no real GPU run has passed yet first, in course order, then those whose last pass is oldest.
   One starts only when the budget left covers its expected time (the manifest's); one still running when the
   budget ends is stopped with its kernel and its ranks.

Each step runs in a process group of its own, within what is left of the budget, and is ended with everything it
started (a notebook's kernel runs in a session of its own, its launches in groups of their own). The last
:data:`STOP_RESERVE` seconds of the budget are kept for that ending and for writing the folder.

Standard library only until the environment is made: the command starts under the image's bare ``python3`` and,
once the packages are there, carries on under the environment's python (the same command, executed again).
On a described machine (``COURSE_MACHINE``: the course is told it is on a GPU machine, its ranks compute on the
CPU) it runs to test itself: no ``test-gpu`` (its figures are a GPU's own), and its folder goes under ``build/``,
never ``reference/gpu/``, whose figures notebooks quote (:mod:`course_utils.kernel.reference`).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from course_utils.common import devices, paths, reaper
from course_utils.kernel import reference
from course_utils.kernel.progress import say

MODULE = "course_utils.tooling.gpu_check"
STOP_RESERVE = 15   # seconds: ending a step (GRACE, then SIGKILL) and writing the folder, inside the budget
GRACE = 8           # seconds from SIGTERM to SIGKILL: a launch's watchdog takes 3 to end its ranks and free /dev/shm
KERNEL = "deepspeed-course"        # the Makefile's KERNEL: the kernelspec the notebooks name
VENV = paths.ROOT / ".venv"
REQUIREMENTS = paths.ROOT / "requirements.txt"
VERSIONS = ("torch", "deepspeed", "transformers", "accelerate")

PASSED, FAILED, PRESENT = "passed", "failed", "present"
STOPPED, INTERRUPTED = "stopped at the budget", "stopped: interrupted"
NOT_RUN = "not run: budget"
STEPS = ("install", "kernel", "cuda", "ops", "test-gpu", "notebooks")


def not_run(why: str) -> str:
    return f"not run: {why}"


def work_dir() -> Path:
    """The logs of this command's steps (not committed): ``build/gpu-check/``."""
    return paths.build_dir() / "gpu-check"


# ---- the budget -------------------------------------------------------------------------------------------------

@dataclass
class Budget:
    """Seconds for the whole command, counted from ``started`` (``clock``'s reading, carried across the re-execution
    under the environment's python: Linux's monotonic clock is the machine's, not the process's)."""
    seconds: float
    started: float
    clock: Callable[[], float] = time.monotonic

    def left(self) -> float:
        """What a step may still take: the budget less the time spent and :data:`STOP_RESERVE`."""
        return max(0.0, self.seconds - STOP_RESERVE - (self.clock() - self.started))

    def covers(self, expected: float) -> bool:
        return self.left() >= expected


# ---- what is recorded -------------------------------------------------------------------------------------------

@dataclass
class Step:
    name: str
    status: str
    seconds: float = 0.0
    note: str = ""
    counts: dict | None = None      # test-gpu: passed, failed, skipped


@dataclass
class Result:
    """One notebook's run: its status, its seconds, a failure's whole text, the figures it recorded."""
    notebook: str
    status: str
    seconds: float = 0.0
    text: str = ""
    metrics: dict = field(default_factory=dict)

    @property
    def first_line(self) -> str:
        return next((line for line in self.text.splitlines() if line.strip()), "")


def failure_name(name: str) -> str:
    return re.sub(r"[^\w.-]+", "-", name).strip("-")


@dataclass
class Record:
    """The run's folder and what goes in it; every change is written at once, so an end by SIGKILL still leaves it."""
    folder: Path
    info: dict
    steps: list[Step] = field(default_factory=list)
    notebooks: list[Result] = field(default_factory=list)

    @classmethod
    def load(cls, folder: Path) -> "Record":
        """The folder the first python began (the re-executed command goes on with it)."""
        info = json.loads((folder / "run.json").read_text())
        steps = [Step(**s) for s in info.pop("steps")]
        listed = json.loads((folder / "notebooks.json").read_text())["notebooks"]
        return cls(folder, info, steps, [Result(n["notebook"], n["status"], n["seconds"]) for n in listed])

    def step(self, step: Step) -> Step:
        self.steps.append(step)
        say(f"  {step.name}: {step.status}" + (f" in {step.seconds:.0f} s" if step.seconds >= 1 else "")
            + (f" — {step.note}" if step.note else ""))
        self.save()
        return step

    def failure(self, name: str, text: str) -> None:
        path = self.folder / "failures" / f"{failure_name(name)}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.rstrip() + "\n")

    def notebook(self, result: Result) -> None:
        if result.metrics:
            (self.folder / "metrics").mkdir(exist_ok=True)
            (self.folder / "metrics" / f"{result.notebook}.json").write_text(json.dumps(result.metrics, indent=1,
                                                                                         default=str))
        if result.status == FAILED:
            self.failure(result.notebook, result.text)
        self.notebooks.append(result)
        say(f"  {result.notebook}: {result.status}" + (f" in {result.seconds:.0f} s" if result.seconds >= 1 else "")
            + (f" — {result.first_line[:200]}" if result.status == FAILED else ""))
        self.save()

    def close(self, why: str) -> None:
        """Every step and notebook not reached: ``not run: <why>``."""
        done = {s.name for s in self.steps}
        self.steps += [Step(name, not_run(why)) for name in STEPS if name not in done]
        ran = {r.notebook for r in self.notebooks}
        self.notebooks += [Result(stem, not_run(why)) for stem in self.info["order"] if stem not in ran]
        self.save()

    def failed(self) -> bool:
        return any(s.status == FAILED for s in self.steps) or any(r.status == FAILED for r in self.notebooks)

    def save(self) -> None:
        steps = [{k: round(v, 1) if k == "seconds" else v for k, v in asdict(s).items() if v is not None}
                 for s in self.steps]
        (self.folder / "run.json").write_text(json.dumps({**self.info, "steps": steps}, indent=1) + "\n")
        rows = [{"notebook": r.notebook, "status": r.status, "seconds": round(r.seconds, 1), "error": r.first_line}
                for r in self.notebooks]
        (self.folder / "notebooks.json").write_text(json.dumps({"notebooks": rows}, indent=1) + "\n")
        (self.folder / "README.md").write_text(readme(self))


def readme(record: Record) -> str:
    """The folder's page for a person: the machine, the commit, each step and each notebook."""
    i = record.info
    v = i.get("versions", {})
    head = (f"# make gpu-check on {reference.gpu_words(i)}, {i['date']}"
            + (" — a described machine, its ranks on the CPU" if i["described"] else ""))
    versions = ", ".join(f"{name} {v[name]}" for name in ("python", *VERSIONS) if v.get(name))
    lines = [head, "",
             f"Commit {reference.short_commit(i)}; budget {i['budget']:g} s; {'smoke' if i['smoke'] else 'full'} "
             f"parameters; driver {i.get('driver') or '—'}, torch's CUDA {v.get('cuda') or '—'}; {versions or '—'}.",
             "", "| step | status | seconds | note |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.note.replace('|', '/')} |" for s in record.steps]
    lines += ["", "| notebook | status | seconds | first error |", "|---|---|---|---|"]
    lines += [f"| {r.notebook} | {r.status} | {r.seconds:.0f} | {r.first_line[:160].replace('|', '/')} |"
              for r in record.notebooks]
    lines += ["", "`run.json` and `notebooks.json` hold the same; `metrics/` each notebook's recorded figures, "
              "`executed/` the executed notebooks, `failures/` each failure's whole text (reference/gpu/README.md)."]
    return "\n".join(lines) + "\n"


# ---- the machine and the checkout -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Machine:
    gpu: str
    count: int
    driver: str | None
    described: bool


def find_machine(run: Callable = subprocess.run) -> Machine:
    """The GPUs ``nvidia-smi`` lists, or those ``COURSE_MACHINE`` describes; SystemExit with what to do when none."""
    try:
        told = devices.described()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if told is not None:
        if int(told["gpus"]) < 1:
            raise SystemExit(f"{devices.MACHINE_ENV} describes a machine without a GPU: describe one with \"gpus\": 1 "
                             "or more, or run on a GPU machine")
        return Machine(told.get("name", "described GPU"), int(told["gpus"]), None, True)
    try:
        out = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                  text=True, timeout=30)
        rows = [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
        said = out.stderr.strip() if out.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        rows, said = [], str(e)
    if said or not rows:
        raise SystemExit(f"No NVIDIA GPU answers here (nvidia-smi: {said or 'no GPU listed'}): run `make gpu-check` "
                         "on a GPU machine (to try the command itself, describe one: COURSE_MACHINE='{\"gpus\": 1, "
                         "\"name\": \"NVIDIA H100 80GB HBM3\"}')")
    return Machine(rows[0][0], len(rows), rows[0][1] if len(rows[0]) > 1 else None, False)


def slug(gpu: str) -> str:
    """``"NVIDIA H200"`` → ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def checkout(given: str | None = None) -> tuple[str | None, bool | None]:
    """(commit, whether the tree had changes) of the checkout; where the copy on the machine has no git history,
    ``given`` (``--commit``: a commit, ``-dirty`` at its end when the tree had changes), else (None, None)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=paths.ROOT, capture_output=True, text=True, timeout=30,
                              check=True).stdout
    try:
        return git("rev-parse", "HEAD").strip(), bool(git("status", "--porcelain").strip())
    except (OSError, subprocess.SubprocessError):
        return (given.removesuffix("-dirty"), given.endswith("-dirty")) if given else (None, None)


def versions() -> dict[str, str | None]:
    """Python's and the course's main packages' versions in this python, and torch's CUDA build."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        import torch
        found["cuda"] = torch.version.cuda
    except ImportError:
        found["cuda"] = None
    return found


def new_folder(out: Path, date: str, gpu: str) -> Path:
    """``<out>/<date>-<gpu slug>``, or with ``-2``, ``-3``… when a run of that day and GPU is there already."""
    out.mkdir(parents=True, exist_ok=True)
    base, n = f"{date}-{slug(gpu)}", 1
    while True:
        folder = out / (base if n == 1 else f"{base}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


# ---- which notebooks, in which order -----------------------------------------------------------------------------

def chosen(prefixes: list[str] | None, notebooks: Path = paths.NOTEBOOKS) -> list[str]:
    """The course's notebooks (stems, in course order) whose names start with one of ``prefixes``, or all."""
    stems = [nb.stem for nb in sorted(notebooks.glob("[0-9][0-9]_*.ipynb"))]
    return [s for s in stems if not prefixes or any(s.startswith(p) for p in prefixes)]


def order(stems: list[str], root: Path | None = None) -> list[str]:
    """Notebooks no real GPU run has passed first, in course order; then the rest, the oldest last pass first."""
    last = reference.last_passed(root)
    ran = sorted((s for s in stems if s in last), key=lambda s: (last[s], stems.index(s)))
    return [s for s in stems if s not in last] + ran


def expected_seconds(smoke: bool) -> dict[str, float]:
    """Notebook stem → the time it is expected to take: the manifest's ``smoke_seconds`` or ``full_seconds``."""
    from course_utils.tooling import manifest

    return {stem: float(e["smoke_seconds" if smoke else "full_seconds"]) for stem, e in manifest.load().items()}


# ---- running a step --------------------------------------------------------------------------------------------

def stop(proc: subprocess.Popen) -> None:
    """End ``proc``, everything it started and their process groups: SIGTERM, SIGKILL after :data:`GRACE`."""
    reaper.stop(proc, GRACE)


def call(command: list[str], log: Path, timeout: float, env: dict | None = None) -> int | None:
    """:func:`course_utils.common.reaper.call` from the checkout, with this command's :data:`GRACE`."""
    return reaper.call(command, log, timeout, env, cwd=paths.ROOT, grace=GRACE)


def tail(log: Path, lines: int = 80) -> str:
    """The end of ``log`` under a line that names it; "" when it is empty or absent."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    if not text:
        return ""
    return f"--- {paths.relative(log)} (last {min(lines, len(text))} of {len(text)} lines)\n" + "\n".join(text[-lines:])


def whole_text(*parts: str) -> str:
    """A failure's text: its parts that say something, a blank line between them."""
    return "\n\n".join(p.strip("\n") for p in parts if p.strip())


def command_step(name: str, command: list[str], record: Record, budget: Budget, env: dict | None = None,
                 note: str = "") -> Step:
    """One step that is one command: passed, failed (its log kept in ``failures/<name>.txt``), stopped at the budget."""
    if budget.left() <= 0:
        return record.step(Step(name, NOT_RUN, note=note))
    log, started = work_dir() / f"{name}.log", time.monotonic()
    say(f"▶ {name}: {' '.join(command[1:] if command[0] == sys.executable else command)} (up to {budget.left():.0f} s)")
    try:
        code = call(command, log, budget.left(), env)
    except KeyboardInterrupt:
        record.step(Step(name, INTERRUPTED, time.monotonic() - started, note))
        raise
    seconds = time.monotonic() - started
    if code is None:
        return record.step(Step(name, STOPPED, seconds, note))
    if code != 0:
        record.failure(name, whole_text(f"{name} exited with status {code}", tail(log, 400)))
        said = "; ".join(x for x in (f"exit status {code}", f"failures/{name}.txt", note) if x)
        return record.step(Step(name, FAILED, seconds, said))
    return record.step(Step(name, PASSED, seconds, note))


# ---- 1. the environment -----------------------------------------------------------------------------------------

def pins(requirements: Path | None = None) -> dict[str, str]:
    """requirements.txt's ``name==version`` lines."""
    lines = (line.split("#")[0].strip() for line in (requirements or REQUIREMENTS).read_text().splitlines())
    return dict(line.split("==", 1) for line in lines if "==" in line)


def installed(name: str) -> bool:
    """Whether this python has the distribution ``name`` (asked of its metadata: nothing is imported)."""
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def missing_packages(requirements: Path | None = None) -> list[str]:
    """The course's packages this python lacks (any version of one that is here will do: the versions are recorded)."""
    return [name for name in pins(requirements) if not installed(name)]


def torch_line(requirements: Path | None = None) -> str:
    pin = pins(requirements).get("torch")
    try:
        have = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return f"No torch in {sys.executable}'s packages: the course's pin, torch=={pin}, comes from the wheelhouse."
    return (f"Keeping this python's torch {have} ({sys.executable}); the course pins torch=={pin} (requirements.txt), "
            f"which is not installed over it.")


def probe(python: Path, budget: Budget) -> list[str] | None:
    """The course's packages ``python`` lacks (None when it cannot tell)."""
    log = work_dir() / "probe.log"
    code = call([str(python), "-m", MODULE, "--missing"], log, min(120.0, budget.left()))
    try:
        return json.loads(log.read_text().strip().splitlines()[-1]) if code == 0 else None
    except (ValueError, IndexError):
        return None


def environment_files(folder: Path, requirements: Path | None = None) -> list[str]:
    """pip's arguments for the course's pins: without torch, and torch held at this python's own version, when this
    python has one (pip then never takes the wheelhouse's CPU build of the pin to satisfy another package)."""
    requirements = requirements or REQUIREMENTS
    try:
        have = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ["-r", str(requirements)]
    folder.mkdir(parents=True, exist_ok=True)
    kept = [line for line in requirements.read_text().splitlines() if not re.match(r"\s*torch\s*==", line)]
    (folder / "requirements.txt").write_text("\n".join(kept) + "\n")
    (folder / "constraints.txt").write_text(f"torch=={have}\n")
    return ["-r", str(folder / "requirements.txt"), "-c", str(folder / "constraints.txt")]


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def sees_this_python(venv: Path) -> bool:
    """Whether ``venv`` sees this python's packages (as :func:`make_venv` makes it; ``make setup``'s does not)."""
    if sys.prefix != sys.base_prefix:
        return (site_packages(venv) / "_image_packages.pth").exists()
    cfg = venv / "pyvenv.cfg"
    return cfg.exists() and re.search(r"^include-system-site-packages\s*=\s*true", cfg.read_text(), re.M) is not None


def make_venv(venv: Path, budget: Budget) -> int | None:
    """A virtual environment over this python that sees its packages. ``--system-site-packages`` shows the base
    installation's; when this python is itself a virtual environment (as a GPU image's often is) its own
    site-packages are added with a ``.pth`` file, where ``venv`` cannot reach them. Its pip is this python's."""
    command = [sys.executable, "-m", "venv", "--system-site-packages", str(venv)]
    if installed("pip"):
        command.insert(-1, "--without-pip")
    code = call(command, work_dir() / "venv.log", budget.left())
    if code == 0 and sys.prefix != sys.base_prefix:
        # a line that starts with "import" is run: addsitedir also reads that folder's own .pth files
        (site_packages(venv) / "_image_packages.pth").write_text(
            f"import site; list(map(site.addsitedir, {site.getsitepackages()!r}))\n")
    return code


def ended(what: str, code: int | None) -> str:
    return f"{what} {'was stopped at the budget' if code is None else f'exited with status {code}'}"


def install(wheelhouse: Path, budget: Budget) -> tuple[str, list[Path]]:
    """Make ``.venv`` from the wheelhouse, without network: ("", []) when done, else (why, the logs that say more).
    When pip fails, ``make setup``'s check of the wheelhouse (its Python, its platform, its pins) says what to
    change, though it asks for torch's pinned version, which this command does not (it keeps the machine's)."""
    python = VENV / "bin" / "python"
    if python.exists() and installed("torch") and not sees_this_python(VENV):
        return (f"{paths.relative(VENV)} exists and does not see this python's packages, its torch among them (made "
                f"by `make setup`?): move it away, and the next run makes one over this python"), []
    if not python.exists() and (code := make_venv(VENV, budget)) != 0:
        return ended("python -m venv", code), [work_dir() / "venv.log"]
    log, check = work_dir() / "pip.log", work_dir() / "wheelhouse-check.log"
    code = call([str(python), "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse),
                 "--disable-pip-version-check", *environment_files(work_dir())], log, budget.left())
    if code != 0:
        call([sys.executable, "-m", "course_utils.tooling.wheelhouse", "check", str(wheelhouse)], check,
             min(60.0, budget.left()))
        return ended("pip", code), [log, check]
    # the checkout on the environment's path, as `pip install -e .` puts it, without a build backend to install
    (site_packages(VENV) / "course_checkout.pth").write_text(f"{paths.ROOT}\n")
    return "", []


def prepare(record: Record, budget: Budget, wheelhouse: Path | None) -> Path | None:
    """The python the rest runs under: this one, ``.venv``'s, or ``.venv``'s once made; None when there is none."""
    started = time.monotonic()

    def done(status: str, note: str, python: Path | None) -> Path | None:
        record.step(Step("install", status, time.monotonic() - started, note))
        return python
    missing = missing_packages()
    if not missing:
        return done(PRESENT, f"the course's packages are in {sys.prefix}", Path(sys.executable))
    python = VENV / "bin" / "python"
    if python.exists() and probe(python, budget) == []:
        return done(PRESENT, f"the course's packages are in {paths.relative(VENV)}", python)
    if wheelhouse is None:
        return done(FAILED, f"this python lacks {', '.join(missing[:6])}{' …' if len(missing) > 6 else ''} and no "
                    "wheelhouse was given: WHEELHOUSE=<folder> (`make wheelhouse` where there is network), or "
                    "`make setup`", None)
    line = torch_line()
    say(line)
    why, logs = install(wheelhouse, budget)
    if not why and (left := probe(python, budget)) != []:
        why = f"{paths.relative(VENV)} still lacks {', '.join(left or ['(cannot tell)'])}"
        logs = [work_dir() / "probe.log"]
    if why:
        record.failure("install", whole_text(why, *(tail(log, 400) for log in logs)))
        return done(FAILED, f"{why}; failures/install.txt", None)
    return done("installed", f"from {wheelhouse} into {paths.relative(VENV)}. {line}", python)


# ---- 2. the kernel, the GPU, the ops, test-gpu -----------------------------------------------------------------

def kernel_python() -> str | None:
    """The python the course's kernelspec starts, or None when there is none."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return os.path.abspath(KernelSpecManager().get_kernel_spec(KERNEL).argv[0])
    except NoSuchKernel:
        return None


def kernel_step(record: Record, budget: Budget) -> Step:
    """The kernelspec papermill runs the notebooks with, starting this python (the Makefile's ``kernel`` step)."""
    from course_utils.kernel import kernel_main

    here = os.path.abspath(sys.executable)
    if kernel_python() == here and kernel_main.starts_course_kernel(KERNEL):
        return record.step(Step("kernel", PRESENT, note=f"{KERNEL} starts {here}"))
    scratch = tempfile.mkdtemp()      # ipykernel stages the spec in a folder under TMPDIR and leaves it behind
    try:
        step = command_step("kernel", [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL,
                                       "--display-name", f"DeepSpeed course ({paths.relative(sys.prefix)})"],
                            record, budget, {**os.environ, "TMPDIR": scratch})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if step.status == PASSED and kernel_python() != here:
        step.status, step.note = FAILED, (f"another {KERNEL} kernelspec comes first and starts {kernel_python()}: "
                                          "remove it (`jupyter kernelspec list` shows where)")
        record.save()
    elif step.status == PASSED:
        kernel_main.install(KERNEL)       # as the Makefile's kernel step: the course's kernel module
    return step


CUDA_PROBE = ("import json, torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
              "print(json.dumps([torch.__version__, torch.version.cuda, n, torch.cuda.get_device_name(0) if n else '']))")


def cuda_step(record: Record, budget: Budget) -> Step:
    """torch sees the GPUs nvidia-smi listed: otherwise every figure would be a CPU's, filed as a GPU's. Asked in a
    process of its own: a CUDA context here would hold GPU memory through every notebook."""
    log = work_dir() / "cuda.log"
    code = call([sys.executable, "-c", CUDA_PROBE], log, min(120.0, budget.left()))
    try:
        version, build, count, name = json.loads(log.read_text().strip().splitlines()[-1])
    except (ValueError, IndexError):
        record.failure("cuda", whole_text(f"torch's CUDA probe failed (exit status {code})", tail(log)))
        return record.step(Step("cuda", FAILED, note="torch's CUDA probe failed; failures/cuda.txt"))
    if count:
        return record.step(Step("cuda", PASSED, note=f"torch {version} (CUDA {build}) sees {count} × {name}"))
    return record.step(Step("cuda", FAILED, note=(
        f"torch {version} (CUDA build {build}) sees no GPU while nvidia-smi lists {record.info['gpu_count']} × "
        f"{record.info['gpu']}: this environment's torch is not the machine's CUDA build (a .venv that `make setup` "
        f"made with the CPU pin? move it away and run again)")))


def ops_step(record: Record, budget: Budget) -> Step:
    """DeepSpeed's ops, as ``make ops`` builds them. A described machine's ranks compute on the CPU and load the CPU
    builds: those are built, as on a CPU machine (the CUDA list would build CPU code into the CUDA folder)."""
    command = [sys.executable, "-m", "course_utils.kernel.opbuild", "--build"]
    if not record.info["described"]:
        return command_step("ops", command, record, budget)
    env = {k: v for k, v in os.environ.items()
           if k not in (devices.MACHINE_ENV, devices.ACCELERATOR_ENV, "TORCH_EXTENSIONS_DIR")}
    return command_step("ops", command, record, budget, env, "described machine: the CPU builds its ranks load")


def junit(xml: Path) -> tuple[dict[str, int], dict[str, str], str]:
    """A junit file's counts (passed, failed, skipped), each failed test's text, and the first skip's reason."""
    import xml.etree.ElementTree as ET

    counts, texts, skip = {"passed": 0, "failed": 0, "skipped": 0}, {}, ""
    for case in ET.parse(xml).iter("testcase"):
        bad = [e for e in case if e.tag in ("failure", "error")]
        skipped = case.find("skipped")
        if bad:
            counts["failed"] += 1
            texts[case.get("name", "?")] = "\n\n".join(f"{e.get('message', '')}\n{e.text or ''}" for e in bad)
        elif skipped is not None:
            counts["skipped"] += 1
            skip = skip or skipped.get("message", "")
        else:
            counts["passed"] += 1
    return counts, texts, skip


def gpu_tests_step(record: Record, budget: Budget) -> Step:
    """``make test-gpu``'s pytest, its junit read into counts and each failure's text (``failures/test-gpu-*.txt``).
    All skipped is a failure here: on a GPU machine it means torch saw no GPU."""
    if record.info["described"]:
        return record.step(Step("test-gpu", not_run("described machine"), note="its figures are a GPU's own (CUDA "
                                "memory, the fp16 engine, offload off the GPU); the ranks here compute on the CPU"))
    xml = record.folder / "test-gpu.xml"
    step = command_step("test-gpu", [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:xdist",
                                     f"--junitxml={xml}"], record, budget)
    if not xml.exists():
        return step
    step.counts, texts, skip = junit(xml)
    for name, text in texts.items():
        record.failure(f"test-gpu-{name}", text)
    if step.status == PASSED and not step.counts["passed"]:
        step.status, step.note = FAILED, f"no test passed: {skip or 'none collected'}"
    step.note = "; ".join(x for x in (", ".join(f"{n} {k}" for k, n in step.counts.items()), step.note) if x)
    say(f"  test-gpu: {step.status} — {step.note}")
    record.save()
    return step


# ---- 3. the notebooks -------------------------------------------------------------------------------------------

Runner = Callable[[str, float], Result]      # (notebook stem, seconds it may take) → its result


def run_notebooks(stems: list[str], expected: dict[str, float], budget: Budget, runner: Runner,
                  record: Record) -> None:
    """Each notebook in turn while the budget left covers its expected time; from the first it does not cover on,
    ``not run: budget``. Ctrl-C: the running one is ``stopped: interrupted``, the rest ``not run: interrupted``; a
    runner that raises fails its notebook, with the traceback."""
    for i, stem in enumerate(stems):
        if not budget.covers(expected[stem]):
            say(f"  {budget.left():.0f} s left, {stem} expects {expected[stem]:.0f} s: it and the rest are not run")
            for rest in stems[i:]:
                record.notebook(Result(rest, NOT_RUN))
            return
        say(f"▶ notebook {i + 1} of {len(stems)}: {stem} (expects {expected[stem]:.0f} s, {budget.left():.0f} s left)")
        started = budget.clock()
        try:
            result = runner(stem, budget.left())
        except KeyboardInterrupt:
            record.notebook(Result(stem, INTERRUPTED, budget.clock() - started))
            raise
        except Exception:      # the runner itself broke: this notebook's failure, and the others still run
            result = Result(stem, FAILED, budget.clock() - started, traceback.format_exc())
        record.notebook(result)


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def traceback_of(executed: Path) -> str:
    """The last error's traceback in an executed notebook (as the learner would see it, without colours)."""
    try:
        cells = json.loads(executed.read_text()).get("cells", [])
    except (OSError, ValueError):
        return ""
    errors = [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    return ANSI.sub("", "\n".join(errors[-1].get("traceback", []))) if errors else ""


def notebook_runner(folder: Path, smoke: bool) -> Runner:
    """Run each notebook in a child process of its own (``--notebook``), which ``call`` can end with its kernel and
    ranks; the executed notebook goes to ``<folder>/executed/``."""
    def run(stem: str, timeout: float) -> Result:
        from course_utils.tooling.course import kernel_log

        notebook = paths.NOTEBOOKS / f"{stem}.ipynb"
        executed, answer, log = folder / "executed" / notebook.name, work_dir() / f"{stem}.json", kernel_log(notebook)
        answer.parent.mkdir(parents=True, exist_ok=True)
        answer.unlink(missing_ok=True)
        started = time.monotonic()
        code = call([sys.executable, "-m", MODULE, "--notebook", stem, "--executed", str(executed), "--result",
                     str(answer), *(["--smoke"] if smoke else [])], log, timeout)
        seconds = time.monotonic() - started
        if code is None:       # what it recorded before it was stopped
            figures = paths.metrics_dir() / f"{stem}.json"
            return Result(stem, STOPPED, seconds, metrics=json.loads(figures.read_text()) if figures.exists() else {})
        if not answer.exists():
            return Result(stem, FAILED, seconds, whole_text(f"the notebook's process ended (exit status {code}) "
                                                            "before it reported", tail(log)))
        out = json.loads(answer.read_text())
        if out["ok"]:
            return Result(stem, PASSED, out["seconds"], metrics=out["metrics"])
        shown = traceback_of(executed)
        return Result(stem, FAILED, out["seconds"],
                      whole_text(out["error"], shown and f"--- traceback\n{shown}", tail(log)), out["metrics"])
    return run


def execute_one(stem: str, executed: Path, answer: Path, smoke: bool) -> int:
    """The child process of :func:`notebook_runner`: papermill with the course kernel (:func:`course.execute`), its
    outcome written to ``answer``."""
    from course_utils.kernel.opbuild import NOTEBOOK_ENV
    from course_utils.tooling.course import execute

    os.environ[NOTEBOOK_ENV] = stem        # as in `make course`: a launch of a script without a prefix knows its notebook
    o = execute(paths.NOTEBOOKS / f"{stem}.ipynb", executed, {"SMOKE": True} if smoke else None)
    answer.write_text(json.dumps({"ok": o.ok, "seconds": o.seconds, "error": o.error, "metrics": o.metrics},
                                 default=str))
    return 0


# ---- the command ------------------------------------------------------------------------------------------------

def archive(folder: Path, where: Path) -> Path:
    """``<where>/<folder name>.tar.gz``: the folder as one flat file, for a machine that hands back only a few."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{folder.name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return path


def start_record(a: argparse.Namespace, machine: Machine, out: Path) -> Record:
    commit, dirty = checkout(a.commit)          # before the folder exists: the run's own folder is no change of the tree
    now = datetime.now(timezone.utc)
    info = {"date": now.strftime("%Y-%m-%d"), "started": now.isoformat(timespec="seconds"), "gpu": machine.gpu,
            "gpu_count": machine.count, "driver": machine.driver, "described": machine.described, "commit": commit,
            "dirty": dirty, "budget": a.budget, "smoke": a.smoke, "only": a.only,
            "order": order(chosen(a.only), out), "versions": versions()}
    record = Record(new_folder(out, info["date"], machine.gpu), info)
    record.save()
    say(f"make gpu-check: {machine.count} × {machine.gpu}{' (described)' if machine.described else ''}, budget "
        f"{a.budget:.0f} s; writing {paths.relative(record.folder)}/; notebooks in this order: "
        f"{' '.join(s[:2] for s in info['order'])}")
    return record


def output_root(a: argparse.Namespace, machine: Machine) -> Path:
    """``--out``; by default ``reference/gpu/``, or ``build/gpu-reference/`` on a described machine, whose figures
    are not a GPU's and must never be where notebooks quote GPU runs from."""
    if a.out is None:
        return paths.build_dir() / "gpu-reference" if machine.described else paths.reference_dir()
    if machine.described and a.out.resolve() == paths.reference_dir().resolve():
        raise SystemExit(f"{paths.relative(a.out)} holds real GPU runs only, and this machine is described "
                         f"({devices.MACHINE_ENV}): leave out --out (its folder goes under build/) or give another one")
    return a.out


def rest(record: Record, budget: Budget, smoke: bool) -> None:
    """Everything after the environment, under its python."""
    if kernel_step(record, budget).status == FAILED:
        record.close("no kernelspec")
        return
    if record.info["described"]:
        record.step(Step("cuda", not_run("described machine")))
    elif cuda_step(record, budget).status == FAILED:
        record.close("torch sees no GPU")
        return
    ops_step(record, budget)
    gpu_tests_step(record, budget)
    started = time.monotonic()
    try:
        run_notebooks(record.info["order"], expected_seconds(smoke), budget, notebook_runner(record.folder, smoke),
                      record)
    except KeyboardInterrupt:
        record.step(Step("notebooks", INTERRUPTED, time.monotonic() - started))
        raise
    counts: dict[str, int] = {}
    for r in record.notebooks:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = next((s for s in (FAILED, STOPPED) if s in counts), PASSED)
    record.step(Step("notebooks", status, time.monotonic() - started, ", ".join(f"{n} {s}" for s, n in counts.items())))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m course_utils.tooling.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, help="seconds the whole command may take (the machine's time, less its start)")
    p.add_argument("--wheelhouse", type=Path, help="a folder of wheels to make the environment from, without network")
    p.add_argument("--out", type=Path, help="where the run's folder goes (default: reference/gpu)")
    p.add_argument("--only", nargs="+", metavar="NN", help="notebook prefixes, e.g. 00 04")
    p.add_argument("--smoke", action="store_true", help="the notebooks with SMOKE=True (the tests' parameters)")
    p.add_argument("--archive", nargs="?", const="", metavar="DIR",
                   help="also write <folder>.tar.gz, in DIR or beside the folder")
    p.add_argument("--commit", metavar="SHA[-dirty]", help="the checkout's commit, where the copy on this machine has "
                   "no git history (-dirty: the tree had changes)")
    for hidden in ("--resume", "--notebook", "--executed", "--result"):       # the command's own processes
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--started", type=float, help=argparse.SUPPRESS)
    p.add_argument("--missing", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.notebook or a.missing:
        return a
    if a.budget is None or a.budget <= STOP_RESERVE:
        p.error(f"--budget SECONDS, more than {STOP_RESERVE} (the last {STOP_RESERVE} s end a step and write the folder)")
    if a.wheelhouse is not None and not a.wheelhouse.is_dir():
        p.error(f"--wheelhouse {a.wheelhouse}: no such folder")
    if not chosen(a.only):
        p.error(f"--only {' '.join(a.only)}: no notebook of {paths.relative(paths.NOTEBOOKS)}/ starts so (give prefixes "
                "such as 00 04)")
    for name in ("wheelhouse", "out", "archive"):     # the command goes on from the checkout's root
        if getattr(a, name):
            setattr(a, name, Path(getattr(a, name)).absolute())
    return a


def forwarded(a: argparse.Namespace, folder: Path, started: float) -> list[str]:
    """The command line that goes on with ``folder`` under another python (paths absolute: it starts at the root)."""
    args = ["--budget", repr(a.budget), "--resume", str(folder), "--started", repr(started)]
    args += [*(["--only", *a.only] if a.only else []), *(["--smoke"] if a.smoke else [])]
    args += [*(["--out", str(a.out)] if a.out else []), *(["--wheelhouse", str(a.wheelhouse)] if a.wheelhouse else [])]
    return args + ([] if a.archive is None else ["--archive", str(a.archive)])


def go_on_under(python: Path, a: argparse.Namespace, record: Record, budget: Budget) -> None:
    say(f"Going on under {python}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(paths.ROOT)
    os.execv(python, [str(python), "-m", MODULE, *forwarded(a, record.folder, budget.started)])


def interrupted(*_) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.missing:
        print(json.dumps(missing_packages()))
        return 0
    if a.notebook:
        return execute_one(a.notebook, Path(a.executed), Path(a.result), a.smoke)
    budget = Budget(a.budget, time.monotonic() if a.started is None else a.started)
    if a.resume:
        record = Record.load(Path(a.resume))
    else:
        machine = find_machine()
        record = start_record(a, machine, output_root(a, machine))
    code, before = 0, signal.signal(signal.SIGTERM, interrupted)     # the machine's own end of the command: as Ctrl-C
    try:
        python = Path(sys.executable) if a.resume else prepare(record, budget, a.wheelhouse)
        if python is None:
            record.close("no environment")
        elif not a.resume and missing_packages():     # another python, or this one started without site-packages
            go_on_under(python, a, record, budget)
        else:
            rest(record, budget, a.smoke)
    except KeyboardInterrupt:
        code = 130
        record.close("interrupted")
    except Exception as e:          # the command's own fault: its traceback kept with the rest
        record.failure("gpu-check", traceback.format_exc())
        record.close(f"the command failed ({type(e).__name__}: failures/gpu-check.txt)")
        raise
    finally:
        record.info["versions"] = versions()
        record.close("not reached")
        if a.archive is not None:
            say(f"Archive: {archive(record.folder, a.archive or record.folder.parent)}")
        say(f"Written: {paths.relative(record.folder)}/ (README.md says what ran)")
        signal.signal(signal.SIGTERM, before)
    return code or (1 if record.failed() else 0)


if __name__ == "__main__":
    sys.exit(main())
