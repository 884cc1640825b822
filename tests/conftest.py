"""Shared fixtures: a private build folder per test session, and notebook execution with papermill."""
from __future__ import annotations

import getpass
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from unittest import mock

import nbformat
import pytest

from course_utils.tooling import manifest, symptoms
from course_utils.common import devices, paths
from course_utils.tooling.course import execute
from course_utils.tooling.nbtools import cut_table_cells
from course_utils.tooling.workshop import unscored_checks

SMOKE = {"SMOKE": True}
CELL_TIMEOUT = 900   # seconds: far above any smoke cell (each launch has its own, shorter timeout), far below CI's limit

# Seconds each notebook's tests take with the smoke parameters on 2 CPU cores (the manifest's smoke_seconds).
# `make test` runs the tests on two workers (pytest-xdist); starting the longest first keeps both busy to the end.
SMOKE_SECONDS = manifest.smoke_seconds()
OTHER_SECONDS = {"test_gpu_machines": 70, "test_slurm": 10, "test_hub": 30, "test_multinode": 40, "test_workshop": 35, "test_launch": 10, "test_own_scripts": 20, "test_gpu_check": 40, "test_one_gpu": 10}   # notebook 08 on a 1-GPU machine, ssh launches, the nbgrader drill, the runner, plain CLI launches


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: notebook tests by their smoke duration, the grading drill, the runner's launches, the rest."""
    def expected_seconds(item: pytest.Item) -> float:
        name = item.path.stem
        if name.startswith("test_nb_"):
            return SMOKE_SECONDS.get(name[len("test_nb_"):][:2], 60)
        return OTHER_SECONDS.get(name, 0)

    items.sort(key=expected_seconds, reverse=True)      # a stable sort: same-file tests keep their order


@pytest.fixture(scope="session", autouse=True)
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every run, metric and executed notebook of the test session goes to a fresh folder."""
    folder = tmp_path_factory.mktemp("build")
    os.environ["COURSE_BUILD_DIR"] = str(folder)
    return folder


REPLAY = """\
# Added by the tests: every exercise again with the student edition's source, in this kernel, then its check; then
# each wrong answer declared for it (tests/answers), then its check again. The solution is put back after each one,
# and the figures the notebook recorded are put back after them all. The outcomes go to {out}.
import json as _json, time as _time
from pathlib import Path as _Path
from IPython.utils.capture import capture_output as _capture
from course_utils.common import paths as _paths
from course_utils.kernel.checks import ExerciseCheckError as _Refused, ExerciseNotDone as _NotDone
_ip, _outcomes = get_ipython(), {{}}
_kept = {{_p: _p.read_bytes() for _p in _paths.metrics_dir().glob("*.json")}}
_ip.showtraceback = lambda *a, **k: None      # the expected failures are recorded, not shown as cell errors
def _outcome(_kind, _why, _error, _seen, _started, **_more):
    return {{"kind": _kind, "why": _why, "error": type(_error).__name__ if _error is not None else "passed",
            "refused": isinstance(_error, _Refused) and not isinstance(_error, _NotDone),
            "message": str(_error) if _error is not None else "", "output": _seen.stdout + _seen.stderr,
            "seconds": round(_time.perf_counter() - _started, 2), **_more}}
for _name, _student, _solution, _check, _trials in {exercises!r}:
    _ip.run_cell(_student, store_history=False)
    _error = _ip.run_cell(_check, store_history=False).error_in_exec
    _outcomes[_name] = {{"student": type(_error).__name__ if _error is not None else "passed", "trials": []}}
    _ip.run_cell(_solution, store_history=False)
    for _kind, _why, _source, _cells in _trials:
        _started = _time.perf_counter()
        with _capture() as _seen:
            _ip.run_cell(_source, store_history=False)
            for _cell in _cells:
                _error = _ip.run_cell(_cell, store_history=False).error_in_exec
                if _error is not None:
                    break
        _outcomes[_name]["trials"].append(_outcome(_kind, _why, _error, _seen, _started))
        _ip.run_cell(_solution, store_history=False)
# Exercises whose checks read one launch (answers.together): each kind's answers for all of them, then that launch once,
# and every check must refuse its own exercise (the cells after a refusal still run, as a learner runs the next cell).
for _names, _solutions, _group in {groups!r}:
    for _kind, _whys, _sources, _cells, _checks in _group:
        _started, _errors = _time.perf_counter(), {{}}
        with _capture() as _seen:
            for _source in _sources:
                _ip.run_cell(_source, store_history=False)
            for _i, _cell in enumerate(_cells):
                _error = _ip.run_cell(_cell, store_history=False).error_in_exec
                if _i in _checks:
                    _errors[_checks[_i]] = _error
                elif _error is not None:
                    _errors = {{_n: _errors.get(_n, _error) for _n in _names}}
                    break
        for _name, _why in zip(_names, _whys):
            _outcomes[_name]["trials"].append(_outcome(_kind, _why, _errors.get(_name), _seen, _started,
                                                       together=list(_names)))
        for _solution in _solutions:
            _ip.run_cell(_solution, store_history=False)
for _p, _bytes in _kept.items():
    _p.write_bytes(_bytes)
del _ip.showtraceback
open({out!r}, "w").write(_json.dumps(_outcomes))
"""

# Which declared wrong answers the notebook tests replay: "all" (the default, as `make test` runs them) or "kernel"
# (only those whose check launches no ranks: a quicker run while writing a notebook).
TRIALS_ENV = "COURSE_TRIALS"


def replays_launches() -> bool:
    """Whether the notebook tests replay the wrong answers whose check launches ranks (see TRIALS_ENV)."""
    return os.environ.get(TRIALS_ENV, "all") != "kernel"


def trials_of(nb, ex: dict, launches: bool) -> list[tuple]:
    """The declared wrong answers of exercise ``ex`` as the replay runs them: (kind, why, source, cells to run after);
    none for an exercise replayed with others (:func:`grouped_trials`)."""
    import answers

    name = nb.metadata.get("course_name", "")
    declared = answers.load(name)
    wrong = declared.get(ex["name"])
    if wrong is None or (wrong.launches and not launches) or ex["check"] is None or \
            any(ex["name"] in group for group in answers.together(name)):
        return []
    first = ex["cell"] + 1 if wrong.run == "from_solution" else ex["check"]
    cells = [nb.cells[j].source for j in range(first, ex["check"] + 1) if nb.cells[j].cell_type == "code"]
    return [(a.kind, a.why, a.source, cells) for a in wrong.answers]


def grouped_trials(nb, launches: bool) -> list[tuple]:
    """The exercises replayed together (``answers.together``) as the replay runs them: (names, their solutions,
    [(kind, whys, sources, cells, {position in cells: the exercise whose check it is})]). The cells run from the first
    cell after the group's first exercise to its last check, leaving out the group's exercise cells."""
    import answers
    from course_utils.tooling.student import exercises

    name = nb.metadata.get("course_name", "")
    if not launches:
        return []
    declared, found = answers.load(name), {ex["name"]: ex for ex in exercises(nb)}
    replay = []
    for group in answers.together(name):
        members = [found[n] for n in group]
        own = {ex["cell"] for ex in members}
        span = range(min(ex["cell"] for ex in members) + 1, max(ex["check"] for ex in members) + 1)
        at = [j for j in span if nb.cells[j].cell_type == "code" and j not in own]
        checks = {at.index(ex["check"]): ex["name"] for ex in members}
        trials = []
        for kind in answers.KINDS:
            for given in zip(*(declared[n].of(kind) for n in group)):
                trials.append((kind, [a.why for a in given], [a.source for a in given],
                               [nb.cells[j].source for j in at], checks))
        replay.append((list(group), [nb.cells[ex["cell"]].source for ex in members], trials))
    return replay


# A notebook may tag one cell with this: the replay then runs just before that cell instead of after the last one.
# Notebooks 14 and 18 tag a cell before the one that stops their cluster (18: its time-limit drill's): their exercises'
# jobs run on the notebook's own cluster (after the stop, each trial would start a cluster of its own).
# The cells after it must not read what the exercises' cells set (a wrong answer's job is the last one they ran).
REPLAY_TAG = "tests-replay-here"


def replay_position(nb, name: str) -> int:
    """Where the replay cell goes in ``nb``: before the cell tagged :data:`REPLAY_TAG`, else at the end. At most one
    cell may carry the tag, and only after every exercise's check."""
    from course_utils.tooling.student import exercises

    here = [i for i, c in enumerate(nb.cells) if REPLAY_TAG in c.metadata.get("tags", [])]
    assert len(here) <= 1, f"{name}: more than one cell tagged {REPLAY_TAG!r}"
    assert not here or all(here[0] > ex["check"] for ex in exercises(nb)), \
        f"{name}: the cell tagged {REPLAY_TAG!r} comes before an exercise's check"
    return here[0] if here else len(nb.cells)


def with_student_replay(notebook: Path, out: Path, launches: bool | None = None) -> Path:
    """A copy of ``notebook`` with a cell that replays each exercise with the student source (the nbgrader stub)
    followed by its check cell, and then each of its declared wrong answers (tests/answers), in the kernel that
    has just run the notebook: at its end, or before the cell tagged :data:`REPLAY_TAG`. ``launches``: also the
    answers whose check launches ranks (by default unless ``COURSE_TRIALS=kernel``)."""

    from course_utils.tooling.student import exercises, student_source

    if launches is None:
        launches = replays_launches()
    nb = nbformat.read(str(notebook), as_version=4)
    nb.metadata["course_name"] = notebook.stem
    replay = [(ex["name"], student_source(nb.cells[ex["cell"]].source), nb.cells[ex["cell"]].source,
               nb.cells[ex["check"]].source, trials_of(nb, ex, launches)) for ex in exercises(nb)]
    cell = nbformat.v4.new_code_cell(REPLAY.format(exercises=replay, groups=grouped_trials(nb, launches), out=str(out)))
    nb.cells.insert(replay_position(nb, notebook.name), cell)
    copy = paths.build_dir() / "with_replay" / notebook.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(copy))
    return copy


def refused_badly(name: str, notebook: Path, replayed: dict) -> list[str]:
    """What is wrong with the replayed wrong answers of ``name``: one that passed or failed otherwise than by the
    check's refusal (or by another refusal than the one its ``says`` names), or whose refusal shows a ``secret`` or a
    line of the exercise's solution."""
    import answers
    from course_utils.tooling.student import BEGIN, END, exercises

    nb = nbformat.read(str(notebook), as_version=4)
    solutions = {ex["name"]: nb.cells[ex["cell"]].source for ex in exercises(nb)}
    declared = answers.load(name)
    said = []
    for exercise, outcome in replayed.items():
        block = solutions[exercise].split(BEGIN, 1)[1].split(END, 1)[0]
        lines = [l.strip() for l in block.splitlines() if len(l.strip()) >= 25 and not l.strip().startswith("#")]
        secrets = list(declared[exercise].secret) if exercise in declared else []
        for t in outcome["trials"]:
            where = f"{exercise} ({t['kind']}: {t['why']})"
            if not t["refused"]:
                said.append(f"{where}: {t['error']} instead of the check's refusal: {t['message'][-400:]}")
                continue
            says = [a.says for a in declared[exercise].answers if a.why == t["why"] and a.says] if exercise in declared else []
            if says and says[0] not in t["message"]:
                said.append(f"{where}: refused, but not by the check's branch that says {says[0]!r}: {t['message'][-400:]}")
            shown = t["message"] + t["output"]
            leaks = [s for s in secrets if s in shown] + [l for l in lines if l in shown]
            if leaks:
                said.append(f"{where}: the refusal shows the answer: {leaks}")
    return said


def processes_of(run_dir: Path) -> list:
    """Live processes that belong to a launch: their command line or environment names its run folder."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in a for a in p.info["cmdline"] or []) or \
                    p.environ().get("COURSE_RUN_DIR") == str(run_dir):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def described(p) -> str:
    """``pid name (state) command line`` of a process :func:`processes_of` found."""
    try:
        return f"{p.pid} {p.name()} ({p.status()}) {' '.join(p.cmdline())[:120]}"
    except Exception:       # gone meanwhile
        return f"{p.pid} (gone)"


# Caches a library keeps in the temporary folder on purpose, the same folder each run (not one per run):
# torch's Inductor cache, which importing a transformers model creates (torch/_inductor/runtime/cache_dir_utils.py).
TEMPORARY_CACHES = {f"torchinductor_{getpass.getuser()}"}


@contextmanager
def temporary_folder_of_its_own() -> Iterator[Path]:
    """An empty folder that the notebook's kernel and every rank it launches use as TMPDIR (they inherit this
    process's environment); what is still in it when the notebook is done outlived it. Removed after."""
    folder = Path(tempfile.mkdtemp(prefix="nb-"))       # short: sockets made in it must fit in 108 bytes
    try:
        with mock.patch.dict(os.environ, {"TMPDIR": str(folder)}):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_EXECUTED: dict[tuple, dict] = {}       # (name, parameters, source, machine) → figures: one execution per test session


def _has_gpu() -> bool:
    """The symptom index quotes the CPU run's messages (a GPU words some of them its own way)."""
    import torch
    return torch.cuda.is_available()


def run_notebook(name: str, parameters: dict | None = None, source: Path | None = None, machine: dict | None = None) -> dict:
    """Execute notebook ``name`` with the smoke parameters (plus ``parameters``); return its metrics (a second
    call in the same session with the same arguments returns the first one's figures). ``machine``: the course is
    told it runs on that machine (``COURSE_MACHINE``, e.g. ``{"gpus": 1}``) while its ranks compute on the CPU.

    Fails the test with the failing cell and its error when the notebook does not run through. Then, in
    the same kernel, each exercise's check must raise ``ExerciseNotDone`` on the student edition's source
    of the exercise (see ``with_student_replay``): the student copy's checks fail without a second run; and each
    wrong answer declared for it in tests/answers must be refused (on a described machine, only those whose check
    launches nothing: the CPU run replays them all).
    """
    key = (name, json.dumps(parameters, sort_keys=True, default=str), str(source), json.dumps(machine, sort_keys=True))
    if key in _EXECUTED:
        return json.loads(json.dumps(_EXECUTED[key]))
    notebook = source or paths.NOTEBOOKS / f"{name}.ipynb"
    outcomes = paths.build_dir() / "replay" / f"{name}.json"
    outcomes.parent.mkdir(parents=True, exist_ok=True)
    outcomes.unlink(missing_ok=True)
    runs_before = set(paths.runs_dir().glob("*")) if paths.runs_dir().exists() else set()
    told = {devices.MACHINE_ENV: json.dumps(machine)} if machine else {}
    with temporary_folder_of_its_own() as scratch, mock.patch.dict(os.environ, told):
        if machine:     # what this CPU process was told about its own ops and accelerator is not the GPU machine's
            for variable in ("TORCH_EXTENSIONS_DIR", devices.ACCELERATOR_ENV):
                os.environ.pop(variable, None)
        replay = with_student_replay(notebook, outcomes, launches=None if machine is None else False)
        outcome = execute(replay, paths.build_dir() / "executed" / notebook.name,
                          {**SMOKE, **(parameters or {})}, cell_timeout=CELL_TIMEOUT, cwd=paths.NOTEBOOKS)
        left_behind = sorted(p.name for p in scratch.iterdir() if p.name not in TEMPORARY_CACHES)
    leftover = [described(p) for run in set(paths.runs_dir().glob("*")) - runs_before for p in processes_of(run)]
    if not outcome.ok:      # the failure first: what it left behind may be its consequence
        pytest.fail(f"{name} failed at {outcome.error}\n(executed copy: {outcome.output})"
                    + (f"\nand processes of its launches outlived the notebook: {leftover}" if leftover else ""),
                    pytrace=False)
    assert not leftover, f"{name}: processes of its launches outlived the notebook: {leftover}"
    assert not left_behind, f"{name}: its kernel or ranks left these in the temporary folder: {left_behind}"
    metrics = paths.metrics_dir() / f"{name}.json"
    assert metrics.exists(), f"{name} ran but recorded no figures to {metrics}"
    executed = nbformat.read(str(outcome.output), as_version=4)
    unscored = unscored_checks(executed)
    assert not unscored, f"{name}: nbgrader would not give these solved checks their point: {unscored}"
    cut = cut_table_cells(executed)
    assert not cut, f"{name}: a table shows cells cut short (course_utils.kernel.notebook.whole_table_cells): {cut}"
    if parameters is None and source is None and machine is None and not _has_gpu():
        unseen = symptoms.missing(name, executed)
        assert not unseen, (f"{name}: the symptom index (notebooks/appendix/symptoms.toml) quotes messages this run no "
                            f"longer prints; update their entries and `python -m course_utils.tooling.tables --write`: "
                            f"{unseen}")
    replayed = json.loads(outcomes.read_text())
    student = {exercise: outcome["student"] for exercise, outcome in replayed.items()}
    assert replayed and set(student.values()) == {"ExerciseNotDone"}, (
        f"on the student edition every exercise's check must raise ExerciseNotDone; got {student}")
    badly = refused_badly(name, notebook, replayed)
    assert not badly, f"{name}: wrong answers the checks must refuse:\n" + "\n".join(badly)
    _EXECUTED[key] = json.loads(metrics.read_text())
    return json.loads(json.dumps(_EXECUTED[key]))


def student_errors(name: str, tmp_path: Path, parameters: dict | None = None) -> tuple[int, list[str]]:
    """Execute the student copy of ``name`` through to the end (errors allowed).

    Returns the number of exercises (cells with a solution; a cell may hold several blocks) and the error names the cells raised, in order.
    The executed copy is kept as ``tmp_path / "executed.ipynb"``, for a failure to be read.
    """
    from nbclient import NotebookClient
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from course_utils.tooling.student import BEGIN, student_copy

    source = paths.NOTEBOOKS / f"{name}.ipynb"
    exercises = sum(BEGIN in c.source for c in nbformat.read(str(source), as_version=4).cells)   # one check per exercise cell
    copy = student_copy(source, tmp_path)
    nb = parameterize_notebook(load_notebook_node(str(copy)), {**SMOKE, **(parameters or {})})
    NotebookClient(nb, timeout=CELL_TIMEOUT, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.write(nb, str(tmp_path / "executed.ipynb"))
    errors = [o.ename for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    return exercises, errors
