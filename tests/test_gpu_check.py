"""``make gpu-check`` (course_utils/tooling/gpu_check.py) and the reader of its runs (course_utils/kernel/reference.py).

A GPU machine is at hand for minutes: the order of its notebooks, the budget rule, the folder it leaves whatever
happens, the environment it makes without replacing the machine's torch, and the figures notebooks quote from it
(never a described machine's) are checked here with fakes; the real command runs once on a described 1-GPU machine.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from conftest import processes_of
from course_utils.common import devices, paths, reaper
from course_utils.kernel import reference
from course_utils.kernel.launch.processes import shm_pattern
from course_utils.tooling import gpu_check

H100 = {"gpus": 1, "name": "NVIDIA H100 80GB HBM3", "cores": 16}
COURSE = ["00_setup_and_first_launch", "01_distributed_concepts", "05_memory_planning", "06_mixed_precision",
          "08_trainer_integration"]


def fake_run(root: Path, name: str, statuses: dict[str, str], *, described: bool = False, started: str = "",
             metrics: dict | None = None, gpu: str = "NVIDIA H200", commit: str = "1234567890abcdef") -> Path:
    """A run folder as ``make gpu-check`` writes it: run.json, notebooks.json, metrics/."""
    folder = root / name
    (folder / "metrics").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "date": name[:10], "started": started or f"{name[:10]}T10:00:00+00:00", "gpu": gpu, "gpu_count": 1,
        "described": described, "commit": commit, "dirty": False}))
    (folder / "notebooks.json").write_text(json.dumps({"notebooks": [{"notebook": s, "status": st, "seconds": 1.0,
                                                                      "error": ""} for s, st in statuses.items()]}))
    for stem, figures in (metrics or {}).items():
        (folder / "metrics" / f"{stem}.json").write_text(json.dumps(figures))
    return folder


# ---- the order: never run on a real GPU first -------------------------------------------------------------------

def test_notebooks_no_real_gpu_run_passed_come_first_in_course_order_then_the_oldest_pass(tmp_path):
    fake_run(tmp_path, "2026-11-20-nvidia-h200", {COURSE[0]: "passed", COURSE[2]: "passed", COURSE[3]: "failed"})
    fake_run(tmp_path, "2026-11-25-nvidia-h200", {COURSE[2]: "passed", COURSE[4]: "stopped at the budget"})
    fake_run(tmp_path, "2026-11-26-nvidia-h100", {COURSE[1]: "passed", COURSE[3]: "passed"}, described=True)
    # 01 and 06 passed only on a described machine, 06 and 08 failed or were stopped on a real one: never run
    assert gpu_check.order(COURSE, tmp_path) == [COURSE[1], COURSE[3], COURSE[4], COURSE[0], COURSE[2]]
    assert reference.last_passed(tmp_path) == {COURSE[0]: "2026-11-20T10:00:00+00:00",
                                               COURSE[2]: "2026-11-25T10:00:00+00:00"}
    assert gpu_check.order(COURSE, tmp_path / "none yet") == COURSE


def test_two_runs_of_one_day_are_ordered_by_their_start(tmp_path):
    fake_run(tmp_path, "2026-11-20-nvidia-h200", {COURSE[0]: "passed"}, started="2026-11-20T18:00:00+00:00")
    fake_run(tmp_path, "2026-11-20-nvidia-h200-2", {COURSE[1]: "passed"}, started="2026-11-20T09:00:00+00:00")
    assert gpu_check.order(COURSE[:2], tmp_path) == [COURSE[1], COURSE[0]]


# ---- the budget rule ----------------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def a_record(tmp_path: Path, order: list[str]) -> gpu_check.Record:
    info = {"date": "2026-11-28", "started": "2026-11-28T10:00:00+00:00", "gpu": "NVIDIA H200", "gpu_count": 1,
            "driver": None, "described": False, "commit": None, "dirty": None, "budget": 100, "smoke": True,
            "order": order, "versions": {}}
    return gpu_check.Record(gpu_check.new_folder(tmp_path, info["date"], info["gpu"]), info)


def test_a_notebook_starts_only_when_the_budget_left_covers_its_expected_time(tmp_path):
    clock = Clock()
    budget = gpu_check.Budget(100, 0.0, clock)
    assert budget.left() == 100 - gpu_check.STOP_RESERVE
    assert budget.covers(100 - gpu_check.STOP_RESERVE) and not budget.covers(100.5 - gpu_check.STOP_RESERVE)
    took, started = {"a": 30, "b": 40, "c": 20, "d": 5}, []

    def runner(stem: str, may_take: float) -> gpu_check.Result:
        started.append((stem, may_take))
        clock.now += took[stem]
        return gpu_check.Result(stem, gpu_check.PASSED, took[stem])
    record = a_record(tmp_path, list(took))
    expected = {"a": 30, "b": 40, "c": 20, "d": 5}
    gpu_check.run_notebooks(list(took), expected, budget, runner, record)
    # 85 s: a (30) and b (40) run, each told what is left; 15 s do not cover c (20): c and, after it, d are not run
    assert started == [("a", 85), ("b", 55)]
    assert [(r.notebook, r.status) for r in record.notebooks] == [
        ("a", "passed"), ("b", "passed"), ("c", "not run: budget"), ("d", "not run: budget")]


def test_a_step_past_the_budget_is_stopped_with_what_it_started(tmp_path):
    """``call`` stops a command at its timeout; ``stop`` ends it with what it started in sessions of their own, as a
    notebook's kernel and its launches are."""
    assert gpu_check.call([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "a.log", 0.5) is None
    pid_file = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(g.pid)); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        assert reaper.alive(grandchild)
        gpu_check.stop(proc)
        assert not reaper.alive(proc.pid) and not reaper.alive(grandchild)
    finally:
        reaper.end(groups=[proc.pid], at_once=True)
        proc.wait()


# ---- the folder: status per notebook, failures kept, a second run beside the first, written after a failure --------

def run_with(monkeypatch, tmp_path: Path, runner, *args: str) -> tuple[int, Path]:
    """The command in this process on a described 1-GPU machine, its notebooks run by ``runner``."""
    monkeypatch.setenv(devices.MACHINE_ENV, json.dumps(H100))
    monkeypatch.setattr(gpu_check, "notebook_runner", lambda folder, smoke: runner)
    before = set(tmp_path.glob("*"))
    code = gpu_check.main(["--budget", "200", "--smoke", "--only", "00", "06", "--out", str(tmp_path), *args])
    (folder,) = {p for p in tmp_path.glob("*") if p.is_dir()} - before
    return code, folder


def outcomes(folder: Path) -> dict[str, str]:
    return {n["notebook"]: n["status"] for n in json.loads((folder / "notebooks.json").read_text())["notebooks"]}


def steps(folder: Path) -> dict[str, str]:
    return {s["name"]: s["status"] for s in json.loads((folder / "run.json").read_text())["steps"]}


def one_passes_one_fails(stem: str, may_take: float) -> gpu_check.Result:
    if stem.startswith("00"):
        return gpu_check.Result(stem, gpu_check.PASSED, 3.0, metrics={"launch_seconds": 4.2})
    return gpu_check.Result(stem, gpu_check.FAILED, 2.0, "cell 7: ValueError: fp16 overflow\nthe rest of the text")


def test_the_folder_says_what_each_notebook_did_and_keeps_each_failure_whole(monkeypatch, tmp_path):
    code, folder = run_with(monkeypatch, tmp_path, one_passes_one_fails)
    assert code == 1, "a failed notebook fails the command"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-nvidia-h100-80gb-hbm3", folder.name)
    assert outcomes(folder) == {"00_setup_and_first_launch": "passed", "06_mixed_precision": "failed"}
    assert steps(folder) == {"install": "present", "kernel": "present", "cuda": "not run: described machine",
                             "ops": "passed", "test-gpu": "not run: described machine", "notebooks": "failed"}
    info = json.loads((folder / "run.json").read_text())
    assert info["described"] is True and info["gpu"] == H100["name"] and info["gpu_count"] == 1
    assert info["budget"] == 200 and info["smoke"] is True and set(info["versions"]) >= {"python", "torch", "cuda"}
    assert json.loads((folder / "metrics" / "00_setup_and_first_launch.json").read_text()) == {"launch_seconds": 4.2}
    assert not (folder / "metrics" / "06_mixed_precision.json").exists()
    assert (folder / "failures" / "06_mixed_precision.txt").read_text() == (
        "cell 7: ValueError: fp16 overflow\nthe rest of the text\n")
    listed = json.loads((folder / "notebooks.json").read_text())["notebooks"]
    assert listed[1]["error"] == "cell 7: ValueError: fp16 overflow"
    readme = (folder / "README.md").read_text()
    assert "| 06_mixed_precision | failed | 2 | cell 7: ValueError: fp16 overflow |" in readme
    assert "described machine" in readme
    code, second = run_with(monkeypatch, tmp_path, one_passes_one_fails, "--archive")
    assert second.name == f"{folder.name}-2" and outcomes(folder)["06_mixed_precision"] == "failed"
    with_archive = {p.name for p in tmp_path.glob("*")}
    assert with_archive == {folder.name, second.name, f"{second.name}.tar.gz"}


def test_the_folder_is_written_after_ctrl_c_and_after_the_command_s_own_failure(monkeypatch, tmp_path):
    def interrupted(stem: str, may_take: float) -> gpu_check.Result:
        raise KeyboardInterrupt
    code, folder = run_with(monkeypatch, tmp_path / "ctrl-c", interrupted)
    assert code == 130
    assert outcomes(folder) == {"00_setup_and_first_launch": "stopped: interrupted",
                                "06_mixed_precision": "not run: interrupted"}
    assert steps(folder)["notebooks"] == "stopped: interrupted"

    def broken(*args):
        raise RuntimeError("the ops step broke")
    monkeypatch.setattr(gpu_check, "ops_step", broken)
    with pytest.raises(RuntimeError, match="the ops step broke"):
        run_with(monkeypatch, tmp_path / "crash", one_passes_one_fails)
    (folder,) = (tmp_path / "crash").glob("*")
    assert steps(folder)["ops"] == "not run: the command failed (RuntimeError: failures/gpu-check.txt)"
    assert set(outcomes(folder).values()) == {"not run: the command failed (RuntimeError: failures/gpu-check.txt)"}
    assert "RuntimeError: the ops step broke" in (folder / "failures" / "gpu-check.txt").read_text()


def test_a_runner_that_breaks_fails_its_notebook_and_the_next_one_runs(tmp_path):
    def runner(stem: str, may_take: float) -> gpu_check.Result:
        if stem == "a":
            raise ValueError("no result file")
        return gpu_check.Result(stem, gpu_check.PASSED, 1.0)
    record = a_record(tmp_path, ["a", "b"])
    gpu_check.run_notebooks(["a", "b"], {"a": 1, "b": 1}, gpu_check.Budget(100, 0.0, Clock()), runner, record)
    assert [(r.notebook, r.status) for r in record.notebooks] == [("a", "failed"), ("b", "passed")]
    assert "ValueError: no result file" in (record.folder / "failures" / "a.txt").read_text()


def test_a_failed_notebook_s_text_has_its_traceback_without_colours(tmp_path):
    executed = tmp_path / "06.ipynb"
    error = {"output_type": "error", "ename": "ValueError", "evalue": "late",
             "traceback": ["\x1b[0;31mValueError\x1b[0m Traceback", "\x1b[0;32m----> 3\x1b[0m launch()"]}
    executed.write_text(json.dumps({"cells": [{"outputs": [{"output_type": "error", "traceback": ["earlier"]}]},
                                              {"outputs": [{"output_type": "stream", "text": "x"}, error]}]}))
    assert gpu_check.traceback_of(executed) == "ValueError Traceback\n----> 3 launch()"
    assert gpu_check.traceback_of(tmp_path / "never written.ipynb") == ""
    assert gpu_check.whole_text("cell 3: ValueError: late\n", "", gpu_check.tail(tmp_path / "absent.log")) == (
        "cell 3: ValueError: late")


def test_test_gpu_s_junit_gives_counts_and_each_failure_s_text(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite><testcase name="test_a"/>'
                   '<testcase name="test_b[x]"><failure message="assert 1 == 2">long text</failure></testcase>'
                   '<testcase name="test_c"><skipped message="needs a CUDA GPU"/></testcase>'
                   '<testcase name="test_d"><error message="fixture broke">trace</error></testcase>'
                   '</testsuite></testsuites>')
    counts, texts, skip = gpu_check.junit(xml)
    assert counts == {"passed": 1, "failed": 2, "skipped": 1} and skip == "needs a CUDA GPU"
    assert texts == {"test_b[x]": "assert 1 == 2\nlong text", "test_d": "fixture broke\ntrace"}
    assert gpu_check.failure_name("test-gpu-test_b[x]") == "test-gpu-test_b-x"


# ---- where described runs go ------------------------------------------------------------------------------------

def test_a_described_machine_never_writes_where_notebooks_quote_gpu_runs_from():
    described = gpu_check.Machine("NVIDIA H100 80GB HBM3", 1, None, True)
    real = gpu_check.Machine("NVIDIA H200", 1, "580.159.04", False)
    with pytest.raises(SystemExit, match="real GPU runs only"):
        gpu_check.output_root(gpu_check.parse(["--budget", "60", "--out", str(paths.reference_dir())]), described)
    nothing_given = gpu_check.parse(["--budget", "60"])
    assert gpu_check.output_root(nothing_given, described) == paths.build_dir() / "gpu-reference"
    assert gpu_check.output_root(nothing_given, real) == paths.reference_dir()
    assert gpu_check.slug(real.gpu) == "nvidia-h200"


def test_the_machine_is_what_nvidia_smi_lists_and_the_commit_is_git_s_or_the_one_given(monkeypatch, tmp_path):
    monkeypatch.delenv(devices.MACHINE_ENV, raising=False)
    listed = lambda *a, **k: subprocess.CompletedProcess(a, 0, "NVIDIA H200, 580.159.04\nNVIDIA H200, 580.159.04\n", "")
    assert gpu_check.find_machine(listed) == gpu_check.Machine("NVIDIA H200", 2, "580.159.04", False)

    def absent(*a, **k):
        raise FileNotFoundError("No such file or directory: 'nvidia-smi'")
    with pytest.raises(SystemExit, match="No NVIDIA GPU answers here .*describe one: COURSE_MACHINE="):
        gpu_check.find_machine(absent)
    monkeypatch.setenv(devices.MACHINE_ENV, json.dumps({**H100, "gpus": 0}))
    with pytest.raises(SystemExit, match="without a GPU"):
        gpu_check.find_machine(listed)
    commit, dirty = gpu_check.checkout("0123abc-dirty")
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and dirty is not None, "git's answer comes first"
    monkeypatch.setattr(paths, "ROOT", tmp_path)          # a copy of the checkout without its .git
    assert gpu_check.checkout("0123abc-dirty") == ("0123abc", True)
    assert gpu_check.checkout() == (None, None)


def test_committed_reference_runs_are_real_gpu_runs():
    """Every folder in reference/gpu/ is a real GPU's run the reader can read: a described run committed there would
    be quoted as a GPU's figures."""
    for run_json in sorted(paths.reference_dir().glob("*/run.json")):
        info = json.loads(run_json.read_text())
        assert info.get("described") is False, f"{paths.relative(run_json)}: not a real GPU's run"
        assert (run_json.parent / "notebooks.json").exists() and (run_json.parent / "README.md").exists()
    assert len(reference.runs()) == len(list(paths.reference_dir().glob("*/run.json")))


# ---- the reader -------------------------------------------------------------------------------------------------

def test_the_reader_quotes_the_newest_real_run_where_the_notebook_passed(tmp_path):
    stem = COURSE[3]
    older = fake_run(tmp_path, "2026-11-20-nvidia-h100-80gb-hbm3", {stem: "passed"}, gpu="NVIDIA H100 80GB HBM3",
                     metrics={stem: {"peak_gib": 3.25, "only_older": 1}}, commit="abcdef0123456789")
    fake_run(tmp_path, "2026-11-25-nvidia-h200", {stem: "passed"}, metrics={stem: {"peak_gib": 2.5}})
    fake_run(tmp_path, "2026-11-26-nvidia-h200", {stem: "failed"}, metrics={stem: {"peak_gib": 99.0}})
    fake_run(tmp_path, "2026-11-27-nvidia-h200", {stem: "passed"}, described=True, metrics={stem: {"peak_gib": 7.0}})
    ref = reference.latest(stem, "peak_gib", tmp_path)
    assert (ref.value, ref.gpu, ref.date, ref.commit) == (2.5, "NVIDIA H200", "2026-11-25", "1234567")
    assert reference.latest(stem, "only_older", tmp_path) == reference.Reference(1, "NVIDIA H100 80GB HBM3",
                                                                                 "2026-11-20", "abcdef0", older)
    assert reference.line(stem, "peak_gib", "peak CUDA memory", "{:.1f} GiB", tmp_path) == (
        "GPU reference run (NVIDIA H200, 2026-11-25, commit 1234567): peak CUDA memory 2.5 GiB")


def test_the_reader_has_nothing_without_a_real_run_and_never_a_described_one(tmp_path):
    stem = COURSE[3]
    assert reference.latest(stem, "peak_gib", tmp_path / "absent") is None
    fake_run(tmp_path, "2026-11-27-nvidia-h100-80gb-hbm3", {stem: "passed"}, described=True,
             metrics={stem: {"peak_gib": 7.0}})
    folder = fake_run(tmp_path, "2026-11-28-nvidia-h200", {stem: "passed"}, metrics={stem: {"peak_gib": 1.0}})
    info = json.loads((folder / "run.json").read_text())
    del info["described"]          # a run.json that does not say it was a real GPU is not one
    (folder / "run.json").write_text(json.dumps(info))
    assert reference.latest(stem, "peak_gib", tmp_path) is None
    assert reference.line(stem, "peak_gib", "peak CUDA memory", root=tmp_path) == (
        "peak CUDA memory: no GPU reference run yet")
    (folder / "run.json").write_text("{")
    with pytest.raises(ValueError, match="run.json is not readable JSON"):
        reference.latest(stem, "peak_gib", tmp_path)


# ---- the environment: standard library first, the machine's torch kept ------------------------------------------

def test_the_command_starts_under_a_bare_python():
    """Before the environment exists only the standard library is there: importing the command needs nothing else."""
    code = ("import sys, json, course_utils.tooling.gpu_check; print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] not in sys.stdlib_module_names and not m.startswith('course_utils'))))")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=paths.ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == ["__main__"]


def a_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of one empty package, written by hand (no build backend, no network)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel, info = folder / f"{name}-{version}-py3-none-any.whl", f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{name}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return wheel


def test_the_environment_is_made_without_network_and_keeps_this_python_s_torch(monkeypatch, tmp_path):
    """``.venv`` over this python (itself a virtual environment, as a GPU image's python often is): the wheelhouse's
    packages installed in it, this python's torch seen and kept though requirements.txt pins another one, and the
    checkout importable."""
    import importlib.metadata

    venv, requirements = tmp_path / "venv", tmp_path / "requirements.txt"
    requirements.write_text("# the course's pins\ntorch==0.0.1\ncoursepin==1.0  # a package of the course\n")
    a_wheel(tmp_path / "wheels", "coursepin", "1.0")
    monkeypatch.setattr(gpu_check, "VENV", venv)
    monkeypatch.setattr(gpu_check, "REQUIREMENTS", requirements)
    assert gpu_check.missing_packages() == ["coursepin"]
    torch_version = importlib.metadata.version("torch")
    assert gpu_check.torch_line() == (f"Keeping this python's torch {torch_version} ({sys.executable}); the course "
                                      "pins torch==0.0.1 (requirements.txt), which is not installed over it.")
    budget = gpu_check.Budget(300, time.monotonic())
    why, logs = gpu_check.install(tmp_path / "wheels", budget)
    assert why == "", [log.read_text() for log in logs]
    where = ("import importlib.util as u, json; print(json.dumps([u.find_spec(m).origin for m in "
             "('coursepin', 'torch', 'course_utils')]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", where], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    mine, torch, course = json.loads(out.stdout)
    assert mine.startswith(str(venv)) and course == str(paths.ROOT / "course_utils" / "__init__.py")
    assert torch == importlib.util.find_spec("torch").origin, "the environment sees this python's torch, not another"
    assert (gpu_check.work_dir() / "constraints.txt").read_text() == f"torch=={torch_version}\n"
    (venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" /
     "_image_packages.pth").unlink()       # now as `make setup` makes .venv: blind to this python's torch
    why, logs = gpu_check.install(tmp_path / "wheels", budget)
    assert why.endswith("does not see this python's packages, its torch among them (made by `make setup`?): move it "
                        "away, and the next run makes one over this python") and logs == []


# ---- the real command on a described 1-GPU machine --------------------------------------------------------------

def run_command(command: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``command`` with a timeout; at the timeout SIGTERM (the command ends its steps), SIGKILL for what is left."""
    proc = subprocess.Popen(command, cwd=paths.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        reaper.end(groups=[proc.pid], grace=30)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out)


def shm_buffers_of(runs: set[Path]) -> list[Path]:
    logs = [run / "launch.log" for run in runs if (run / "launch.log").exists()]    # none: ended before the launcher
    ports = {m for log in logs for m in re.findall(r"--master_port[= ](\d+)", log.read_text())}
    return [b for port in ports for b in Path("/dev/shm").glob(Path(shm_pattern(int(port))).name)]


# Seconds of the end-to-end test's budget beyond its first notebook's expected time: the command's steps before it
# (the venv probe) and a notebook slower than its manifest time on a machine that runs other tests beside it.
MARGIN = 40
FIRST_AT_LEAST = 15     # seconds notebook 05 takes at the least with the smoke parameters (about 25 s on 2 cores)


@pytest.mark.notebook
def test_the_command_on_a_described_one_gpu_machine(tmp_path):
    """`make gpu-check` as a GPU machine would run it, from a bare python (``-S``: no site-packages, so it goes on
    under .venv's), with a budget that covers notebook 05's expected smoke time (the manifest's; one of the
    shortest) and :data:`MARGIN` more, for the steps before it and a machine busy with other tests, so that what is
    left once 05 has run (it takes :data:`FIRST_AT_LEAST` s or more) is less than 15's expected time."""
    expected = gpu_check.expected_seconds(smoke=True)
    first, second = expected["05_memory_planning"], expected["15_mixture_of_experts"]
    assert second > first + MARGIN - FIRST_AT_LEAST, \
        "the manifest's smoke times no longer leave 15 out of this budget: choose another pair"
    budget = gpu_check.STOP_RESERVE + first + MARGIN
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", devices.ACCELERATOR_ENV)}
    env.update({devices.MACHINE_ENV: json.dumps(H100), "GPU_CHECK_TEST": mark})
    bare = (gpu_check.VENV / "bin" / "python").exists()
    runs_before = set(paths.runs_dir().glob("*"))
    done = run_command([sys.executable, *(["-S"] if bare else []), "-m", gpu_check.MODULE, "--budget", str(budget),
                        "--smoke", "--only", "05", "15", "--out", str(tmp_path), "--archive"], env, timeout=400)
    new_runs = set(paths.runs_dir().glob("*")) - runs_before
    assert reaper.marked(f"GPU_CHECK_TEST={mark}") == [], "a process of the command outlived it"
    assert not [p.pid for run in new_runs for p in processes_of(run)], "a launch's process outlived the command"
    assert not shm_buffers_of(new_runs), "a launch's /dev/shm buffers outlived the command"
    assert done.returncode == 0 and new_runs, done.stdout
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert outcomes(folder) == {"05_memory_planning": "passed", "15_mixture_of_experts": "not run: budget"}
    info = json.loads((folder / "run.json").read_text())
    assert info["described"] is True and info["gpu"] == H100["name"]
    assert steps(folder)["test-gpu"] == "not run: described machine"
    if bare:
        assert "Going on under" in done.stdout and ".venv" in info["steps"][0]["note"]
    assert json.loads((folder / "metrics" / "05_memory_planning.json").read_text())["oom_killed_rank"] == 1
    # DeepSpeed's launcher logs each launch's world size: the bucket launch took one rank, as on a 1-GPU machine; the
    # out-of-memory lesson, which needs 2 ranks, ran them on CPU
    worlds = {run.name.split("-")[2]: re.findall(r"dist_world_size=(\d+)", (run / "launch.log").read_text())
              for run in new_runs}
    assert worlds == {"05_bucket_memory": ["1"], "05_out_of_memory": ["2"]}, worlds
    assert (folder / "executed" / "05_memory_planning.ipynb").exists()
    assert (tmp_path / f"{folder.name}.tar.gz").exists()
