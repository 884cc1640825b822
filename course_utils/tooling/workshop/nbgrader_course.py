"""The nbgrader course folder, ``build/nbgrader``: its ``nbgrader_config.py`` (written here), nbgrader's Python API
on it, and the release of the student notebooks (``nbgrader generate_assignment``, one assignment per notebook).
"""
from __future__ import annotations

import os
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.tooling.nbtools import select
from course_utils.tooling.student import CODE_STUB, collapse_checks

COURSE_ID = "deepspeed-course"
CELL_TIMEOUT = 300    # seconds per cell: the longest cell of a full `make course` on 2 cores takes under 90 s, and
                      # every launch inside a cell has its own TIMEOUT, which stops a hung launch with its ranks' stacks
STOP_WAIT = 60        # seconds a cell interrupted at its timeout has to stop (a launch is killed in a few)

CONFIG = '''\
# nbgrader's configuration for the DeepSpeed course, rewritten by `make release` and `make grade`
# (course_utils/tooling/workshop/): change their options rather than this file. nbgrader's own commands read it too:
# cd {root} && nbgrader <command>
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
c.Exchange.root = {exchange!r}
# the course's stub: checks.is_done looks for it, so the cells after an unsolved exercise use the course's answer
c.ClearSolutions.code_stub = {{"python": {stub!r}}}
c.ClearSolutions.enforce_metadata = True
# each cell may run {timeout} s; then it is interrupted, gets a CellTimeoutError and the next cells run
c.Execute.timeout = {timeout}
c.Execute.interrupt_on_timeout = True
c.GradeExecute.stop_wait = {stop_wait}
# nbgrader's autograde steps, with the course's Execute: a dead kernel or a cell that ignores the interrupt
# stops the submission there (the cells after it score nothing) instead of losing its every grade
c.Autograde.autograde_preprocessors = [
    "course_utils.tooling.workshop.GradeExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
'''


def root() -> Path:
    """The nbgrader course folder: ``build/nbgrader``."""
    return paths.build_dir() / "nbgrader"


def write_config(timeout: int = CELL_TIMEOUT, stop_wait: int = STOP_WAIT) -> Path:
    """Write ``build/nbgrader/nbgrader_config.py``; return its path."""
    folder = root()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exchange").mkdir(exist_ok=True)
    config = folder / "nbgrader_config.py"
    config.write_text(CONFIG.format(root=str(folder.resolve()), course_id=COURSE_ID,
                                    db_url=f"sqlite:///{(folder / 'gradebook.db').resolve()}",
                                    exchange=os.environ.get("COURSE_NBGRADER_EXCHANGE")   # a workshop hub's (hub.py)
                                    or str((folder / "exchange").resolve()), stub=CODE_STUB, timeout=timeout,
                                    stop_wait=stop_wait))
    return config


def alembic_head() -> str:
    """The gradebook schema's version, which nbgrader asks the ``alembic`` command for when it creates a gradebook
    (a second interpreter: seconds, and only where ``alembic`` is on the PATH), read in this process instead."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


def nbgrader_api(timeout: int = CELL_TIMEOUT, stop_wait: int = STOP_WAIT):
    """nbgrader's Python API on the course folder, configured by the ``nbgrader_config.py`` written here."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    import nbgrader.api

    nbgrader.api.get_alembic_version = alembic_head
    config_file = write_config(timeout, stop_wait)
    config = PyFileConfigLoader(config_file.name, path=str(config_file.parent)).load_config()
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def _succeeded(result: dict, what: str) -> None:
    if not result["success"]:
        raise RuntimeError(f"{what} failed:\n{result.get('log', '')}\n{result.get('error', '')}")


def released(assignment: str) -> Path:
    return root() / "release" / assignment / f"{assignment}.ipynb"


def release(selected: "list[str] | None" = None, folder: Path = paths.NOTEBOOKS, api=None) -> list[Path]:
    """Generate the student assignment of each selected notebook of ``folder`` with ``nbgrader generate_assignment``
    (one assignment per notebook, named after it); return the released notebooks."""
    api = api or nbgrader_api()
    chosen = select(selected, folder)
    if not chosen:
        raise SystemExit(f"no notebook of {paths.relative(folder)} starts with {' or '.join(selected or [])}")
    out = []
    for notebook in chosen:
        source = root() / "source" / notebook.stem / notebook.name
        source.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(collapse_checks(nbformat.read(str(notebook), as_version=4)), str(source))   # as make student
        _succeeded(api.generate_assignment(notebook.stem, force=True, create=True),
                   f"nbgrader generate_assignment {notebook.stem}")
        out.append(released(notebook.stem))
    return out
