"""The course's 2-node Slurm cluster (course_utils.kernel.launch.slurm): its files, its start, a launch across both nodes,
a job over its time limit, a drained node, and its stop — no munged, slurmctld, slurmd or slurmstepd left, no file
outside the build folder, however it ended (stop(), the end of the block, the death of the process that started it)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_utils.common import paths
from course_utils.kernel.launch import slurm, slurm_launch, slurm_setup
from course_utils.kernel.launch.processes import run_processes

WHY_NOT = slurm.why_not()
needs_slurm = pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm cluster here: {WHY_NOT}")


def outside_build(since: float) -> list[str]:
    """Files Slurm, munge or PMIx might write by default, made since ``since``: none may be."""
    found = []
    for pattern in ("/tmp/spmix_appdir_*", "/tmp/ompi.*", "/tmp/slurmd*", "/run/munge/*", "/var/run/munge/*", "/var/spool/slurm*/*",
                    "/var/log/slurm*/*", "/var/log/munge/*", "/var/lib/munge/*", "/var/lib/slurm*/*", f"{paths.ROOT}/slurm-*.out"):
        for p in Path("/").glob(pattern.lstrip("/")):
            try:
                if p.stat().st_mtime >= since:
                    found.append(str(p))
            except OSError:
                pass
    return found


def _gone(folder: Path, wait: float = 10.0) -> list[str]:
    """What of the cluster in ``folder`` is left after up to ``wait`` seconds: processes, the folder itself."""
    deadline = time.monotonic() + wait
    while True:
        left = [f"{p.name()} {p.pid}" for p in slurm.cluster_processes(folder) if _running(p)]
        left += [str(folder)] if folder.exists() else []
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _running(p) -> bool:
    try:
        return p.status() != "zombie"
    except Exception:
        return False


# --- the parts, without a cluster ---

def test_config_keeps_every_path_in_the_clusters_folder(tmp_path):
    conf = slurm_setup.write_config(tmp_path, {"slurmctld": 7001, "n1": 7002, "n2": 7003}, ("n1", "n2"), 4)
    lines = dict(line.split("=", 1) for line in conf.read_text().splitlines() if "=" in line and " " not in line)
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile",
                "SlurmdLogFile", "JobCompLoc"):
        assert lines[key].startswith(str(tmp_path)), key
    assert lines["AuthInfo"] == f"socket={tmp_path / 'munge.socket'},cred_expire=5" and lines["SlurmctldPort"] == "7001"
    assert lines["ProctrackType"] == "proctrack/linuxproc" and lines["TaskPlugin"] == "task/none"
    text = conf.read_text()
    assert "NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=127.0.0.1 Port=7002 CPUs=4" in text and "cgroup" not in text
    node_conf = slurm_setup.node_config(tmp_path, "n2")
    assert node_conf.read_text() == text
    assert (node_conf.parent / "mpi.conf").read_text() == f"PMIxCliTmpDirBase={tmp_path / 'spool' / 'n2'}\n"
    key = slurm_setup.make_key(tmp_path / "k" / "munge.key")
    assert key.stat().st_size == 1024 and key.stat().st_mode & 0o777 == 0o400


def test_missing_programs_are_named_with_their_packages(monkeypatch):
    monkeypatch.setattr(slurm_setup, "find_tool", lambda name: None if name in ("munged", "sbatch") else f"/usr/bin/{name}")
    reason = slurm_setup.why_not()
    assert reason.startswith("munged, sbatch not found") and "apt-get install slurm-wlm munge" in reason


def test_an_exit_status_above_128_names_the_signal_that_ended_a_task():
    assert slurm_launch.exit_status(128 + signal.SIGTERM) == "143 = 128 + 15 (SIGTERM)"
    assert slurm_launch.exit_status(137) == "137 = 128 + 9 (SIGKILL)"
    assert [slurm_launch.exit_status(c) for c in (0, 1, 124, 128)] == ["0", "1", "124", "128"]
    assert slurm_launch.exit_status(255) == "255 = 128 + 127"        # no signal of that number: the sum alone


def test_the_batch_template_builds_its_hostfile_from_the_jobs_nodes():
    text = slurm_launch.batch_script("/v/bin/deepspeed", "scripts/14_slurm_ranks.py", "--sleep", 1)
    assert text.startswith("#!/bin/bash\n#SBATCH") and "#SBATCH --nodes=2" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    assert "--no_ssh --node_rank=\\$SLURM_NODEID" in text and "scripts/14_slurm_ranks.py --sleep 1" in text


def test_kill_on_bad_exit_reaches_the_srun_of_both_srun_ways_and_can_be_left_out(tmp_path, monkeypatch):
    """srun told --kill-on-bad-exit=1 ends the step at the first failed task, and what that task wrote last may not
    reach the output: notebook 14's failing `--launcher slurm` run leaves it out, so its whole message is printed."""
    monkeypatch.setattr(slurm_launch, "master_addr", lambda cluster, node: "127.0.0.1")
    cluster = type("Cluster", (), {"nodes": {"n1": None, "n2": None}})()

    def command(way: str, launcher_args: str = "", **options: bool) -> str:
        return " ".join(slurm_launch.job_command(cluster, way, paths.SCRIPTS / "14_slurm_ranks.py", [], tmp_path,
                                                 29500, "course-x", launcher_args, **options))
    for way in ("srun", "slurm"):
        assert "--kill-on-bad-exit=1" in command(way)
        assert "kill-on-bad-exit" not in command(way, kill_on_bad_exit=False)
    assert "--mpi=pmix --ntasks-per-node=1 --job-name=course-x" in command("slurm", "--mpi=pmix", kill_on_bad_exit=False)
    assert "--mpi=pmix --ntasks-per-node=1 --kill-on-bad-exit=1 --job-name=course-x" in command("slurm", " --mpi=pmix")


# --- a real cluster ---

@needs_slurm
def test_cluster_starts_drains_a_node_and_stops_clean():
    """Start: both nodes idle, each daemon on its own port. A drained node holds a job pending with its reason (and
    slurm_launch.placed says so, or where a job ran, or why sbatch refused it). Stop:
    nothing left, no file outside the build folder. (DeepSpeed launched on both nodes, and the files its launches leave,
    are the tests of notebooks 14 and 18: tests/test_nb_14_your_cluster.py, tests/test_nb_18_cluster_day.py.)"""
    since = time.time() - 1
    with slurm.slurm_cluster() as cluster:
        folder = cluster.folder
        assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
        assert len(set(cluster.ports.values())) == 3
        cluster.command("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=course_test")
        job = cluster.command("sbatch", "--parsable", "-w", "n2", f"--output={folder / 'drained.out'}",
                              "--wrap", "true").stdout.strip()
        info = cluster.wait(job, until=("PENDING",), timeout=20)
        assert info["JobState"] == "PENDING" and "ReqNodeNotAvail" in info["Reason"], info
        assert cluster.node_states()["n2"] == "drain"
        # slurm_launch.placed (notebook 18's exercise): a job that asks for the drained node is reported pending with
        # its reason at once, not after the patience; one that asks only for a node runs on the other; sbatch's refusal
        # is told as sbatch said it
        script = "#!/bin/bash\nsrun hostname\n"
        pinned = slurm_launch.placed(cluster, script, "--nodelist=n2", patience=60)
        assert (pinned.state, pinned.nodes) == ("PENDING", []) and "ReqNodeNotAvail" in pinned.reason, pinned
        assert pinned.waited < 30, "a pending job with a reason that does not clear is not waited for"
        anywhere = slurm_launch.placed(cluster, script, "--nodes=1")
        assert (anywhere.submitted, anywhere.state, anywhere.nodes) == (True, "COMPLETED", ["n1"]), anywhere
        refused = slurm_launch.placed(cluster, script, "--nodes=1", "--nodelist=n1,n2")
        assert not refused.submitted and "invalid number of nodes" in refused.error, refused
        processes = [p.pid for p in slurm.cluster_processes(folder)]
        assert len(processes) >= 4
    assert not _gone(folder), _gone(folder)
    assert not slurm.leftovers()
    assert not outside_build(since), outside_build(since)


@needs_slurm
def test_a_job_being_ended_is_read_in_the_state_it_ends_in():
    """A job ended by slurmctld (a scancel here; notebook 18's time limit) shows COMPLETING until its processes are
    gone: SIGTERM, which this one ignores, then SIGKILL ``KillWait`` (2 s) later. ``settled`` reads past that to the
    state it ends in, and the job-completion record has its line then (notebook 18 read COMPLETING as the job's end)."""
    with slurm.slurm_cluster() as cluster:
        job = cluster.command("sbatch", "--parsable", f"--output={cluster.folder / 'stubborn.out'}",
                              "--wrap", "trap '' TERM; sleep 60").stdout.strip()
        cluster.wait(job, until=("RUNNING",), timeout=20)
        cluster.command("scancel", job)
        ended = cluster.settled(job, timeout=20)
        assert ended["JobState"] == "CANCELLED", ended
        assert cluster.completion(job, wait=10).get("JobState") == "CANCELLED"
        assert cluster.settled(job)["JobState"] == "CANCELLED"      # a job that has ended: at once
    assert not slurm.leftovers()


@needs_slurm
def test_a_cell_run_after_the_stop_gets_a_cluster_of_its_own():
    """``slurm.running``: the cluster itself while it runs; once it is stopped (a cell of notebook 14 run again after
    its last section), a new cluster of the same nodes for the block only, gone when the block ends."""
    with slurm.slurm_cluster() as cluster:
        with slurm.running(cluster) as here:
            assert here is cluster
    assert cluster.stopped
    with slurm.running(cluster) as here:
        assert here is not cluster and here.nodes == cluster.nodes
        assert here.node_states() == {"n1": "idle", "n2": "idle"}
        folder = here.folder
    assert here.stopped and not _gone(folder), _gone(folder)
    assert not slurm.leftovers()


@needs_slurm
def test_an_interrupted_launch_cancels_its_job_and_ends_its_ranks():
    """A KeyboardInterrupt (an interrupted cell) while the ranks sleep: the job is cancelled, no process of the
    launch is left, the cluster goes on serving."""
    def interrupt(*_):
        raise KeyboardInterrupt

    with slurm.slurm_cluster() as cluster:
        before = set(paths.runs_dir().glob("*")) if paths.runs_dir().exists() else set()
        old = signal.signal(signal.SIGALRM, interrupt)
        signal.alarm(4)
        try:
            with pytest.raises(KeyboardInterrupt):
                slurm_launch.launch(cluster, "srun", "--sleep", 120, timeout=100, quiet=True)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        [run_dir] = set(paths.runs_dir().glob("*")) - before
        assert not run_processes(run_dir)
        deadline = time.monotonic() + 20
        while cluster.command("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not cluster.command("squeue", "-h").stdout.strip(), "the launch's job is still queued or running"
        assert cluster.command("srun", "-N", "2", "true").returncode == 0


@needs_slurm
def test_a_dead_starter_leaves_nothing(tmp_path):
    """The process that started the cluster is killed outright (a dead kernel): the watchdog ends every daemon."""
    code = ("import sys, time; from course_utils.kernel.launch import slurm; c = slurm.start(); "
            "print(c.folder, flush=True); time.sleep(600)")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=paths.ROOT,
                               env={**os.environ})
    folder = Path(starter.stdout.readline().strip())
    try:
        assert folder.is_dir() and slurm.cluster_processes(folder)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    assert not _gone(folder, wait=20), _gone(folder)


@needs_slurm
def test_a_kernel_stopped_then_killed_by_jupyter_leaves_nothing():
    """A learner presses the stop button during a cell, then restarts the kernel: Jupyter sends SIGINT, then SIGKILL,
    to the kernel's whole process group. The cluster's watchdog (a session of its own) survives the first, is not
    killed by the second, and ends the cluster and its running job when the kernel is gone."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(paths.ROOT), env={**os.environ})
    kc = km.client()
    kc.start_channels()
    folder, said = None, []

    def run(code: str) -> None:
        reply = kc.execute_interactive(code, timeout=120, output_hook=lambda m: said.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", (code, reply["content"], said)
    try:
        kc.wait_for_ready(timeout=60)
        run("from course_utils.kernel.launch import slurm, slurm_launch\nc = slurm.start()\n"
            "j = slurm_launch.submit(c, '#!/bin/bash\\nsrun sleep 600\\n', '--nodes=2', '--ntasks-per-node=1', name='x')\n"
            "c.wait(j.job_id, until=('RUNNING',))\nprint(c.folder)")
        folder = Path("".join(said).strip().splitlines()[-1])
        # stop_on_error=False: its KeyboardInterrupt must not make the kernel abort the next request (ipykernel
        # aborts what arrives while it flushes its queue after an error, a race with the request sent next)
        sleeping = kc.execute("import time; time.sleep(600)", stop_on_error=False)
        while True:                                # until the kernel runs the cell
            seen = kc.get_iopub_msg(timeout=60)
            if seen["msg_type"] == "execute_input" and seen["parent_header"].get("msg_id") == sleeping:
                break
        time.sleep(0.5)
        km.interrupt_kernel()                      # SIGINT to the kernel's process group
        while kc.get_shell_msg(timeout=60)["parent_header"].get("msg_id") != sleeping:
            pass
        run("assert c.watchdog.poll() is None, 'the watchdog died of the interrupt'")
        assert any(p.name() == "slurmstepd" for p in slurm.cluster_processes(folder)), "the job is running"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)               # SIGKILL to the kernel's process group
    assert folder is not None and not _gone(folder, wait=20), _gone(folder)


@needs_slurm
@pytest.mark.extended
def test_a_job_over_its_time_limit_ends_in_timeout():
    """A job given one minute that would run ten: slurmctld ends it (its time-limit check runs every 30 s, so 60-90 s
    after the job started) and scontrol and the job-completion record say TIMEOUT. Notebook 18 runs the same
    drill and checks the TIMEOUT itself in `make course`; its smoke run in `make test` stops the cluster before the minute
    is out (it checks only the job's deadline), so this test is the one that waits (pytest -m extended)."""
    with slurm.slurm_cluster() as cluster:
        job = slurm_launch.submit(cluster, "#!/bin/bash\nsrun sleep 600\n", "--time=1", "--nodes=2",
                                  "--ntasks-per-node=1", name="timeout")
        info = cluster.wait(job.job_id, timeout=150)
        assert info["JobState"] == "TIMEOUT", info
        assert cluster.completion(job.job_id).get("JobState") == "TIMEOUT"
        folder = cluster.folder
    assert not _gone(folder) and not slurm.leftovers()


def test_a_nodes_job_step_is_the_clusters_though_its_command_line_names_no_folder(tmp_path):
    """slurmstepd carries its node's etc/<node>/slurm.conf and a command line like "slurmstepd: [1.0]": the
    watchdog of a cluster whose starter died must still find and end it (seen left running after a killed test)."""
    folder = tmp_path / "cluster-1-abcdef"
    step = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={"SLURM_CONF": str(folder / "etc" / "n1" / "slurm.conf")})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={"SLURM_CONF": str(tmp_path / "cluster-1-abcdefg" / "slurm.conf")})
    try:
        assert step.pid in slurm.cluster_pids(folder)
        assert other.pid not in slurm.cluster_pids(folder), "another cluster's process is not this one's"
        slurm.end_cluster(folder, grace=1)
        assert step.wait(timeout=10) is not None and other.poll() is None
    finally:
        for p in (step, other):
            p.kill()
            p.wait()
