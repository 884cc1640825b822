"""The course kernel (course_utils.kernel.kernel_main): ipykernel's kernel that ends without the interpreter's
teardown, after every exit handler has run."""
import json
import subprocess
import sys

import nbformat
import pytest

from course_utils.kernel import kernel_main
from course_utils.tooling import course


def test_the_installed_kernelspec_starts_the_course_kernel():
    """make setup's kernel step: the notebooks' kernelspec starts kernel_main, not ipykernel_launcher."""
    assert kernel_main.starts_course_kernel("deepspeed-course")


def test_install_rewrites_only_ipykernels_command(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    spec = tmp_path / "kernels" / "probe"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "probe", "language": "python"}))
    written = kernel_main.install("probe")
    assert json.loads(written.read_text())["argv"] == [*argv[:3], kernel_main.MODULE, *argv[4:]]
    assert kernel_main.install("probe") == written and kernel_main.starts_course_kernel("probe")     # once is enough
    (spec / "kernel.json").write_text(json.dumps({"argv": ["R", "--slave"], "display_name": "r", "language": "R"}))
    with pytest.raises(ValueError, match="does not start ipykernel_launcher"):
        kernel_main.install("probe")
    with pytest.raises(LookupError, match="no kernelspec 'absent'"):
        kernel_main.install("absent")


def test_a_notebook_s_exit_handlers_and_finalizers_still_run(tmp_path):
    """What a notebook registers to run at exit (the course's clean-up does) runs before the kernel ends: an exit
    handler registered in a cell, a weakref.finalize of a temporary folder; and a file left open for writing outside
    the notebook's namespace (which IPython clears at exit) keeps what was written to it, as the interpreter's
    teardown would have flushed it."""
    ran, folder, left_open = tmp_path / "handler_ran", tmp_path / "made", tmp_path / "left_open.txt"
    cell = (f"import atexit, pathlib, tempfile, weakref\n"
            f"atexit.register(lambda: pathlib.Path({str(ran)!r}).write_text('yes'))\n"
            f"keep = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})\n"
            f"pathlib.Path({str(folder)!r}).write_text(keep.name)\n"
            f"tempfile._course_log = open({str(left_open)!r}, 'w')     # held by a module, as a library's log is\n"
            f"tempfile._course_log.write('written, never closed')\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    notebook.metadata["kernelspec"] = {"name": "deepspeed-course", "display_name": "course", "language": "python"}
    nbformat.write(notebook, str(tmp_path / "probe.ipynb"))
    outcome = course.execute(tmp_path / "probe.ipynb", tmp_path / "out.ipynb")
    assert outcome.ok, outcome.error
    assert ran.read_text() == "yes"
    assert left_open.read_text() == "written, never closed"
    made = folder.read_text()
    assert made and not (tmp_path / made).exists(), "the temporary folder's finalizer removed it"


def test_a_kernel_that_fails_to_start_keeps_its_exit_status(tmp_path):
    """ipykernel refuses an option it does not know with exit status 2; ended without the teardown, the kernel still
    exits with it, as a failing ipykernel_launcher does."""
    status = {m: subprocess.run([sys.executable, "-m", m, "--no-such-option"], cwd=tmp_path, capture_output=True,
                                timeout=120).returncode for m in (kernel_main.LAUNCHER, kernel_main.MODULE)}
    assert status[kernel_main.MODULE] == status[kernel_main.LAUNCHER] != 0
