"""The set-up's and the course's progress, and the background op build: which op first, the estimates, the
one line a waiting launch prints, and that a stopped build leaves no process and no lock behind."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils.tooling import course, manifest
from course_utils.kernel import opbuild, ops, progress
from course_utils.common import paths


def test_minutes_reads_like_an_estimate():
    assert [progress.minutes(s) for s in (3, 41, 119, 121, 149, 151, 600)] == ["10 s", "50 s", "120 s", "2 min",
                                                                               "2 min", "3 min", "10 min"]
    assert progress.clock(245) == "4 min 05 s"


def test_time_left_splits_shared_notebooks_over_the_lanes_and_adds_those_that_run_alone():
    estimate = {"a": 100, "b": 60, "c": 40, "z": 80}
    left = progress.left_seconds(["c", "z"], {"a": 30, "b": 60}, estimate, alone={"z"}, lanes=2)
    assert left == pytest.approx((70 + 6 + 40) / 2 + 80)         # b ran past its estimate: a tenth of it is left
    assert progress.left_seconds([], {}, estimate, set(), 2) == 0


def test_the_estimates_learn_this_machines_pace_from_the_notebooks_that_finished():
    """Seen in a fresh make course on a fast machine: every notebook announced with its recorded time (from a slower
    machine) times the build's share; 12 took 90 s against "about 4 min", 17 112 s against "about 5 min"."""
    pace = progress.RunPace()
    assert pace.factor == 1.0 and pace.line(1.0) is None            # nothing finished yet: the recorded times
    pace.add(105, 78)
    pace.add(150, 82)                                                # 00 and 01 of that run
    assert pace.factor == pytest.approx(160 / 255)
    assert "0.63 ×" in pace.line(1.0) and pace.line(pace.factor) is None
    assert progress.minutes(246 * pace.factor) == "3 min"           # 17 of that run: 112 s, "about 5 min" before
    slow = progress.RunPace()
    slow.add(60, 600)
    assert slow.factor == slow.HIGH
    fast = progress.RunPace()
    fast.add(600, 6)
    assert fast.factor == fast.LOW


def test_a_first_run_estimates_from_the_manifests_recorded_run():
    shipped = manifest.full_seconds()
    assert set(shipped) == {nb.stem for nb in paths.NOTEBOOKS.glob("*.ipynb")} and all(s > 0 for s in shipped.values())


def test_set_up_builds_only_what_the_first_notebooks_load_and_the_rest_by_first_need():
    assert [op.name for op in ops.first_ops(ops.COURSE_OPS["cpu"])] == ["deepspeed_shm_comm"]
    assert [op.key for op in ops.first_ops(ops.COURSE_OPS["cuda"])] == ["deepspeed_shm_comm"]   # 00's CPU ranks on 1 GPU
    first_need = [min(op.notebooks or ("00",)).rstrip("+") for op in ops.COURSE_OPS["cpu"]]
    assert first_need == sorted(first_need)
    assert [op.name for op in ops.for_script("01_ring", ops.ALL_OPS)] == ["deepspeed_shm_comm"]
    assert ops.for_script("my_own_script", ops.ALL_OPS) == list(ops.ALL_OPS)      # unknown: every op
    assert [op.name for op in ops.for_script("12_adapters", ops.ALL_OPS)] == ["deepspeed_shm_comm", "fused_adam", "cpu_adam"]


def _configs_named(text: str) -> set[str]:
    return {name for name in re.findall(r"[\w.]+\.json", text) if (paths.CONFIGS / name).exists()}


@pytest.mark.parametrize("notebook", sorted(paths.NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem[:2])
def test_the_op_table_covers_every_offload_a_notebook_launches(notebook):
    """A config a notebook or its script names with optimizer offload loads cpu_adam; with NVMe, async_io (on the
    machines where it launches them: 03 offloads only on one GPU, tests/test_gpu_machines.py)."""
    nn = notebook.stem[:2]
    scripts = "".join(p.read_text() for p in paths.SCRIPTS.glob(f"{nn}_*.py"))
    zero = [json.loads((paths.CONFIGS / c).read_text()).get("zero_optimization", {})
            for c in _configs_named(notebook.read_text() + scripts)]
    devices = {(z.get(k) or {}).get("device") for z in zero for k in ("offload_optimizer", "offload_param")}
    loads = {op.name for device in ops.COURSE_OPS for op in ops.for_script(notebook.stem, ops.course_ops(device))}
    if devices & {"cpu", "nvme"} or "offload_optimizer" in scripts:
        assert "cpu_adam" in loads
    if "nvme" in devices:
        assert "async_io" in loads


def _state(tmp_path: Path, building: str | None, done: dict, since: float | None = None) -> dict:
    return {"pid": os.getpid(), "ops": ["fused_adam", "cpu_adam", "async_io"], "done": done, "building": building,
            "since": time.time() if since is None else since}


def test_pending_adds_the_ops_ahead_of_the_one_waited_for(tmp_path):
    state = _state(tmp_path, "fused_adam", {}, since=time.time() - 30)
    waits = dict(opbuild.pending(["async_io"], state))
    rest = ops.FUSED_ADAM.seconds - 30 + ops.CPU_ADAM.seconds + ops.ASYNC_IO.seconds
    assert waits["async_io"] == pytest.approx(rest, abs=2)
    assert opbuild.pending(["fused_adam"], None) == []
    assert opbuild.pending(["fused_adam"], _state(tmp_path, "cpu_adam", {"fused_adam": "built"})) == []


def test_the_background_build_follows_the_order_the_notebooks_start_in():
    course_order = [nb.stem for nb in sorted(paths.NOTEBOOKS.glob("*.ipynb"))]
    todo = [ops.ASYNC_IO, ops.CPU_ADAM, ops.FUSED_ADAM]
    # 04 needs cpu_adam and async_io; 07, 08, 10 and 12 need cpu_adam alone: it goes first
    assert [op.key for op in ops.build_order(todo, course_order)] == ["fused_adam", "cpu_adam", "async_io"]
    # a queue that starts with 07 (fused_adam and cpu_adam), then 02 (fused_adam): fused_adam serves both
    assert [op.key for op in ops.build_order(todo, ["07_optimizers_and_schedulers", "02_first_deepspeed_loop"])] == [
        "fused_adam", "cpu_adam", "async_io"]
    # ops no queued notebook loads: the shorter builds first
    assert [op.key for op in ops.build_order(todo, ["01_distributed_concepts"])][-1] == "async_io"
    # 16 trains with offload_optimizer and on NVMe (and times both ops): a fresh run starts it once both are built;
    # undeclared, its NVMe launch waited 4 minutes for async_io's background build without a word
    assert {op.key for op in ops.for_script("16_bigger_than_your_device")} >= {"cpu_adam", "async_io"}
    assert {op.key for op in ops.for_script("16_this_machine")} >= {"cpu_adam", "async_io"}


def test_an_op_past_its_estimate_is_given_its_own_pace_not_a_few_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = tmp_path / "async_io"
    folder.mkdir()
    since = time.time() - 300
    assert opbuild.left_of_building("async_io", 400, 300, since) == pytest.approx(100)     # within its estimate
    assert opbuild.left_of_building("async_io", 200, 300, since) == pytest.approx(300)     # no build.ninja yet
    (folder / "build.ninja").write_text("".join(f"build f{i}.o: compile f{i}.cpp\n" for i in range(12))
                                        + "build async_io.so: link f0.o\n")
    old = folder / "f0.o"
    old.write_text("")
    os.utime(old, (since - 100, since - 100))       # an earlier, failed build's file does not count
    assert opbuild.left_of_building("async_io", 200, 300, since) == pytest.approx(300)
    for i in range(1, 4):
        (folder / f"f{i}.o").write_text("")
    # 3 of 12 files in 300 s: 9 more and the link, at 100 s each
    assert opbuild.left_of_building("async_io", 200, 300, since) == pytest.approx(1000)
    # every file written: the link and the load are left, one file's time, whatever CPU the op needed before (a fresh
    # run: async_io's compilers had spent 300 of the 562 s measured before; told "about 5 min", it was ready in 50 s)
    for i in range(4, 12):
        (folder / f"f{i}.o").write_text("")
    assert opbuild.left_of_building("async_io", 200, 300, since) == pytest.approx(300 / 11 * 2)   # f0.o is old
    old.write_text("")
    assert opbuild.left_of_building("async_io", 200, 300, since) == pytest.approx(25)
    assert opbuild.left_of_building("async_io", 200, 300, since, cpu=(300.0, 562.0), pace=1.0) == pytest.approx(25)


def test_a_launch_that_loads_an_op_still_building_waits_with_one_line(tmp_path, capsys):
    reads = iter([_state(tmp_path, "cpu_adam", {"fused_adam": "built"})] * 3 + [None] * 10)
    waited = opbuild.wait_for(["cpu_adam"], "This launch (04_offload_ladder)", poll=0.01, read=lambda: next(reads))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "cpu_adam" in out[0] and "about" in out[0] and "04_offload_ladder" in out[0]
    assert waited > 0
    assert opbuild.wait_for(["fused_adam"], "x", read=lambda: _state(tmp_path, "cpu_adam", {"fused_adam": "built"})) == 0
    assert capsys.readouterr().out == ""


def test_the_course_starts_a_notebook_whose_ops_are_built_before_one_that_waits():
    a, b, c = Path("02_x.ipynb"), Path("06_y.ipynb"), Path("04_z.ipynb")
    blocked = {a: [("fused_adam", 30)], b: [], c: []}
    assert course.next_notebook([a, b, c], [], set(), 2, blocked.get) == b
    assert course.next_notebook([a, c], [b], {c}, 2, blocked.get) is None        # c runs alone: not beside b
    assert course.next_notebook([a], [b], set(), 1, lambda nb: []) is None


def test_stopping_the_background_build_ends_its_process_group_and_releases_its_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '60'])  # course_utils.kernel.opbuild"],
                            start_new_session=True)    # a stand-in build: its command line names the module
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").touch()
    opbuild.write_state(opbuild.state_file(), [ops.CPU_ADAM], {}, "cpu_adam", proc.pid)
    assert opbuild.building_now() == "cpu_adam"
    assert opbuild.stop(proc, grace=5)
    assert proc.poll() is not None
    assert not (tmp_path / "cpu_adam" / "lock").exists() and not opbuild.state_file().exists()
    alive = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert alive == []
    assert opbuild.read_state() is None and not opbuild.stop(proc)
    opbuild.write_state(opbuild.state_file(), [ops.CPU_ADAM], {}, "cpu_adam", os.getpid())
    assert opbuild.read_state() is None, "a live process that is no op build (a reused pid) is not waited for"


def test_a_set_up_step_shows_what_to_act_on_and_logs_the_rest(tmp_path, capsys):
    log = tmp_path / "setup.log"
    noise = "echo 'debconf: delaying package configuration'; echo 'NOTE: install libaio-dev:'; echo '   sudo apt'"
    assert progress.step("packages", ["sh", "-c", noise], log) == 0
    out = capsys.readouterr().out
    assert f"set-up 1 of {len(progress.SETUP_STEPS)}" in out and "about" in out and "NOTE: install libaio-dev" in out and "sudo apt" in out
    assert "debconf" not in out and "debconf" in log.read_text()
    assert progress.step("kernel", ["sh", "-c", "echo boom; exit 3"], log) == 3
    assert "boom" in capsys.readouterr().out and "NOTE" in log.read_text()       # the log keeps the earlier step


def test_a_background_build_whose_starter_is_killed_ends_with_its_compilers(tmp_path):
    """``make course`` killed outright (no ``finally``) must not leave the build and its compilers running."""
    child = ("import subprocess, time\nfrom course_utils import opbuild\nopbuild.end_with_parent(poll=0.1)\n"
             "subprocess.run(['sleep', '60'])\n")
    starter = (f"import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', {child!r}], "
               "start_new_session=True)\nprint(p.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, cwd=paths.ROOT)
    group = int(parent.stdout.readline())
    time.sleep(1)
    assert subprocess.run(["pgrep", "-g", str(group)], capture_output=True).stdout.split()   # the build and its sleep
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and subprocess.run(["pgrep", "-g", str(group)], capture_output=True).stdout:
        time.sleep(0.2)
    assert subprocess.run(["pgrep", "-g", str(group)], capture_output=True).stdout == b""


def test_estimates_follow_the_pace_of_the_ops_already_built():
    pace = opbuild.Pace()
    assert pace.factor == 1.0
    pace.add(100, 250)
    assert pace.factor == 2.5
    pace.add(100, 50)
    assert pace.factor == 1.5
    state = {"pid": os.getpid(), "ops": ["cpu_adam"], "done": {}, "building": "cpu_adam", "since": time.time(),
             "factor": 2.0}
    assert opbuild.pending(["cpu_adam"], state)[0][1] == pytest.approx(2 * ops.CPU_ADAM.seconds, abs=1)


def test_the_background_build_tells_waiters_what_its_compilers_needed_against_the_table(tmp_path, monkeypatch):
    """Each op's state carries the CPU the ops built before it needed over the table's (None before the first)."""
    import signal

    written = []
    monkeypatch.setattr(opbuild, "end_with_parent", lambda: None)
    monkeypatch.setattr(opbuild, "say", lambda line: None)
    monkeypatch.setattr(opbuild, "write_state", lambda path, todo, done, building, **more: written.append(more))
    monkeypatch.setattr(opbuild._ops, "build_one", lambda op: "built")
    used = iter([0.0, 0.5 * ops.FUSED_ADAM.cpu_seconds, 0.5 * ops.FUSED_ADAM.cpu_seconds, 900.0])
    monkeypatch.setattr(opbuild, "_compiler_seconds", lambda: next(used))
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert opbuild.build([ops.FUSED_ADAM, ops.ASYNC_IO], tmp_path / "state.json") == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert [w.get("cpu_ratio") for w in written] == [None, pytest.approx(0.5), None]


def test_a_script_without_a_notebook_prefix_waits_for_the_ops_of_the_notebook_that_runs_it(monkeypatch, capsys):
    state = {"pid": os.getpid(), "ops": ["cpu_adam", "async_io"], "done": {}, "building": "cpu_adam",
             "since": time.time(), "factor": 1.0}
    monkeypatch.setattr(opbuild, "read_state", lambda path=None: state)
    monkeypatch.setattr(opbuild, "wait_for", lambda names, what, quiet=False: names)
    monkeypatch.setenv(opbuild.NOTEBOOK_ENV, "08_trainer_integration")
    assert "async_io" not in opbuild.wait_for_launch("trainer_template")
    monkeypatch.delenv(opbuild.NOTEBOOK_ENV)
    assert "async_io" in opbuild.wait_for_launch("trainer_template")




def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_held_one_kept(tmp_path, monkeypatch, capsys):
    """torch's build lock outlives a process killed while it compiled, and every later load would wait for it."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    op = ops.course_ops()[0]                                   # an op of this machine's own device
    work = ops.folder(op)
    work.mkdir(parents=True)
    lock = work / "lock"
    lock.touch()
    compiler = subprocess.Popen(["sleep", "30"], cwd=work)     # a build's compiler works in the op's folder
    try:
        assert ops.stale_lock(op, settle=0.5) is None, "a lock just taken, its compiler at work: kept"
    finally:
        compiler.kill()
        compiler.wait()
    started = time.monotonic()
    assert ops.stale_lock(op, settle=1.0) == lock, "nobody working there once it is settle seconds old: a leftover"
    assert time.monotonic() - started < 2
    old = time.time() - 60
    os.utime(lock, (old, old))
    compiler = subprocess.Popen(["sleep", "30"], cwd=work)     # a build's compiler works in the op's folder
    try:
        assert ops.clear_stale_locks([op]) == [] and lock.exists(), "held by a running build: kept"
    finally:
        compiler.kill()
        compiler.wait()
    assert ops.clear_stale_locks([op]) == [op.key] and not lock.exists()
    assert "nothing was building it" in capsys.readouterr().out
    assert ops.clear_stale_locks([op]) == []


def test_the_op_table_reads_the_build_cache_without_making_a_folder_per_op(tmp_path, monkeypatch):
    """``ds_report`` lists every op; reading whether each is built must not make an empty folder for it (torch's
    ``_get_build_directory`` makes the folder it names), or notebook 00's listing of the cache shows ops never built."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    report = ("cpu_adam ............ [NO] ....... [OKAY]\n"
              "cpu_lion ............ [NO] ....... [OKAY]\n")
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    rows = {r["op"]: r["built_in_cache"] for r in ops.ds_report_table(report)}
    assert rows == {"cpu_adam": True, "cpu_lion": False}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu_adam"]


def test_an_op_being_built_is_given_the_pace_its_compilers_get_now(tmp_path):
    """However busy the machine, the compilers' CPU so far over the time so far is the pace the rest will get."""
    since = time.time() - 60
    # 30 s of CPU in 60 s (a busy machine: half a core) of 110 s needed: 80 s more at that pace, 160 s
    assert opbuild.left_of_building("fused_adam", 55, 60, since, cpu=(30.0, 110.0)) == pytest.approx(160)
    # an idle machine: 90 s of CPU in 60 s, 20 s more
    assert opbuild.left_of_building("fused_adam", 55, 60, since, cpu=(90.0, 110.0)) == pytest.approx(13.3, abs=0.1)
    # too early to tell, or no /proc: the estimate
    assert opbuild.left_of_building("fused_adam", 220, 10, since, cpu=(3.0, 110.0)) == pytest.approx(210)
    assert opbuild.left_of_building("fused_adam", 220, 60, since, cpu=(None, 110.0)) == pytest.approx(160)



def test_a_wait_counts_the_pace_the_compilers_get_now_not_since_the_op_started(tmp_path):
    """Seen in a fresh make course: 30 s of CPU in 60 s while two notebooks ran beside said "about 3 min"; the
    notebook that waited had freed its cores, and the op was built 25 s later. The pace now says so."""
    since = time.time() - 60
    assert opbuild.left_of_building("fused_adam", 55, 60, since, cpu=(30.0, 77.0), pace=1.8) == pytest.approx(26.1, abs=0.1)
    assert opbuild.left_of_building("fused_adam", 55, 60, since, cpu=(30.0, 77.0), pace=0.0) == pytest.approx(94, abs=0.1)
    # an op that started 2 s ago is still loading torch's build tools (a slow start): the rest at two cores (measured:
    # built 32 s and 38 s later, with the notebooks' cores free)
    cores = min(2, os.cpu_count() or 1)
    assert opbuild.left_of_building("fused_adam", 137, 2, since, cpu=(1.0, 77.0), pace=0.9) == pytest.approx(76 / cores)
    assert opbuild.cpu_needed("fused_adam") == 77 and opbuild.cpu_needed("no_such_op") == 120
    # the ops built before in this run needed 1.4 × the table's CPU (a slow hour): so will this one, within ½ and 2
    assert opbuild.cpu_needed("async_io", {"cpu_ratio": 1.4}) == pytest.approx(1.4 * 360)
    assert opbuild.cpu_needed("async_io", {"cpu_ratio": 5.0}) == 2 * 360
    assert opbuild.cpu_needed("async_io", {"cpu_ratio": None}) == 360
    state = {"pid": os.getpid(), "cpu_at_start": 0.0, "building": "fused_adam", "since": since}
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 4: pass"])
    try:
        pace = opbuild.recent_pace(lambda: state, seconds=1.5)
    finally:
        busy.kill()
        busy.wait()
    assert pace is not None and 0.05 < pace <= 1.2, pace     # one busy child: up to a core, however busy the machine
    moved = iter([state, {**state, "building": "cpu_adam"}])
    assert opbuild.recent_pace(lambda: next(moved), seconds=0.1) is None, "the build moved on: no pace to tell"


def test_the_compilers_cpu_is_read_from_the_builders_process_tree():
    """A child that burns CPU under this process counts once it runs and once it is reaped (the builder's cutime)."""
    start = {"pid": os.getpid(), "cpu_at_start": opbuild._compiler_seconds()}
    burn = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\ntime.sleep(30)"])
    try:
        deadline = time.time() + 20
        while (opbuild.compilers_cpu(start) or 0) < 1.4 and time.time() < deadline:
            time.sleep(0.2)
        assert 1.4 <= opbuild.compilers_cpu(start) < 5
    finally:
        burn.kill()
        burn.wait()
    assert 1.4 <= opbuild.compilers_cpu(start) < 5          # reaped: now in this process's cutime
    assert opbuild.compilers_cpu({"pid": 0, "cpu_at_start": 0.0}) is None
    assert opbuild.compilers_cpu({"pid": os.getpid(), "cpu_at_start": None}) is None


def test_a_step_runs_a_second_command_beside_its_own_and_ends_it_with_the_step(tmp_path, capsys):
    """Set-up installs the system packages (apt) beside pip: both run at once, the NOTE lines of either are shown,
    the step ends when both have (a failed step too: apt is never cut off mid-install by pip's failure); an
    interrupted step ends what runs beside it, whole."""
    log = tmp_path / "setup.log"
    started = time.monotonic()
    beside = ["sh", "-c", "sleep 2; echo 'NOTE: Slurm is not installed:'; echo '   sudo apt-get install slurm-wlm'"]
    assert progress.step("packages", ["sh", "-c", "sleep 2; echo pip done"], log, beside=beside) == 0
    assert time.monotonic() - started < 3.5, "the two commands ran one after the other (4 s)"
    out = capsys.readouterr().out
    assert "NOTE: Slurm is not installed" in out and "sudo apt-get install slurm-wlm" in out
    assert "pip done" in log.read_text() and "# beside it: sh -c" in log.read_text()
    assert not list(tmp_path.glob(".setup.log.beside")), "its output file is gone with it"
    assert progress.step("kernel", ["true"], log, beside=["sh", "-c", "exit 4"]) == 4, "its failure is the step's"
    done = tmp_path / "apt-finished"
    assert progress.step("kernel", ["sh", "-c", "exit 3"], log, beside=["sh", "-c", f"sleep 1; touch {done}"]) == 3
    assert done.exists(), "a failed step still lets the command beside it finish"

    marker = tmp_path / "still-running"
    forever = ["sh", "-c", f"sh -c 'sleep 30; touch {marker}' & wait"]
    with pytest.raises(KeyboardInterrupt):
        with progress._beside(forever, log):
            time.sleep(0.5)
            raise KeyboardInterrupt
    left = subprocess.run(["pgrep", "-f", f"touch {marker}"], capture_output=True, text=True).stdout.split()
    assert left == [], "an interrupted step leaves nothing of the command beside it running"
