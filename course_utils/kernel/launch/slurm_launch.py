"""DeepSpeed launched under Slurm, on the course's cluster (:mod:`.slurm`), three ways, each with a timeout:

- ``"srun"``: ``srun -N 2`` starts one shell per node, which runs DeepSpeed's launcher for that node only
  (``deepspeed --hostfile <h> --no_ssh --node_rank=$SLURM_NODEID ...``): DeepSpeed's documented way without ssh;
- ``"slurm"``: one ``deepspeed --launcher slurm`` on this machine; DeepSpeed's ``SlurmRunner`` runs
  ``srun -n <ranks> python -u script`` itself, and each rank finds its place with MPI (mpi4py);
- ``"openmpi"``: ``salloc -N 2`` holds both nodes and runs ``deepspeed --launcher openmpi``, whose ``OpenMPIRunner``
  runs ``mpirun`` (which starts its daemons on the allocation's nodes with ``srun``).

The ranks get the course's launch environment (:func:`environment.rank_environment`: the run folder, the rank hook,
the core share) through Slurm's ``--export=ALL``, and write their records to a run folder as under
:func:`~course_utils.kernel.launch.deepspeed`. A launch that runs past its timeout is cancelled (``scancel``) and every
process of it ended.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.common import paths, run_folder
from course_utils.common.record import read_as, read_records
from course_utils.common.records.slurm import SlurmRank
from course_utils.kernel.launch.commands import deepspeed_cli, free_port, new_run_dir, resolve_script, write_hostfile
from course_utils.kernel.launch.environment import rank_environment
from course_utils.kernel.launch.processes import (die_with_parent, end_run_processes, kill_group, release_shm_buffers,
    run_processes)
from course_utils.kernel.launch.slurm import SlurmCluster, why_not
from course_utils.kernel.launch.streams import LearnerFilter

WAYS = ("srun", "slurm", "openmpi")
SCRIPT = "14_slurm_ranks.py"


@dataclass
class SlurmLaunch:
    """What one launch under Slurm did: its command, output, exit code and the ranks' records."""
    way: str
    command: str                # the shell command, as a learner would type it on the login node
    returncode: int
    output: str
    records: list[dict]
    run_dir: Path
    seconds: float
    timed_out: bool = False

    @property
    def ranks(self) -> list[SlurmRank]:
        """Each rank's :class:`SlurmRank` record (scripts/14_slurm_ranks.py), by rank."""
        return ranks_of(self.records)

    def error(self, lines: int = 3) -> str:
        """The last lines of the output that name an error (DeepSpeed's, Slurm's or Python's), else its last line."""
        marks = ("Error", "error:", "srun:", "exited with", "Exception", "ORTE", "mpirun", "not installed")
        found = [ln.strip() for ln in self.output.splitlines() if any(m in ln for m in marks)]
        return "\n".join(found[-lines:]) or (self.output.strip().splitlines() or [""])[-1]

    def task_lines(self) -> str:
        """What happened to each task, in the order it was said: ``srun``'s lines naming a task and MPI's own
        "An error occurred in ..." line (which call a task died in)."""
        return "\n".join(ln.strip() for ln in self.output.splitlines()
                         if (ln.startswith("srun: error:") and ": task " in ln) or "error occurred in" in ln)


def available(what: str) -> bool:
    """True when this machine can run the course's Slurm cluster; otherwise print why ``what`` is skipped."""
    reason = why_not()
    if reason is None:
        return True
    print(f"⏭  {what}: {reason}")
    return False


def ranks_of(records: list[dict]) -> list[SlurmRank]:
    """The :class:`SlurmRank` records (scripts/14_slurm_ranks.py) among ``records``, by rank."""
    return sorted(read_as(records, SlurmRank, rank=None), key=lambda v: (v.rank, v.slurm_procid or 0))


def launch_env(cluster: SlurmCluster, run_dir: Path, port: int, world_size: int = 2) -> dict[str, str]:
    """The course's rank environment (run folder, rank hook, cores) plus this cluster's ``SLURM_CONF`` and the port
    the ranks meet on (``COURSE_MASTER_PORT``), and Open MPI's session folders in the cluster's folder: what
    ``sbatch``/``srun`` export to the job's tasks."""
    env = rank_environment(run_dir, world_size, {"SLURM_CONF": str(cluster.conf), "COURSE_MASTER_PORT": port})
    env["OMPI_MCA_orte_tmpdir_base"] = str(cluster.folder)   # Open MPI's session folders: not in /tmp
    if os.geteuid() == 0:        # mpirun refuses root unless told twice (Open MPI's own variables)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def master_addr(cluster: SlurmCluster, node: str) -> str:
    """The address of ``node`` as slurm.conf gives it (``NodeAddr``): the node names here resolve nowhere else."""
    out = cluster.command("scontrol", "show", "node", node, "-o").stdout
    return next(f.split("=", 1)[1] for f in out.split() if f.startswith("NodeAddr="))


def job_command(cluster: SlurmCluster, way: str, script: Path, script_args: list[str], run_dir: Path,
                port: int, job_name: str, launcher_args: str = "", hostfile: bool = True,
                kill_on_bad_exit: bool = True) -> list[str]:
    """The command line of ``way`` (:data:`WAYS`) for one rank per node on every node of the cluster;
    ``launcher_args``: more options for the ``srun`` (``slurm``) or ``mpirun`` (``openmpi``) DeepSpeed builds.
    For ``"srun"`` only: ``hostfile=False`` leaves DeepSpeed's hostfile out (each launcher then sees only its own
    node). For ``"srun"`` and ``"slurm"``: ``kill_on_bad_exit=False`` lets the other tasks go on when one fails, and
    ``srun`` then waits for every task and forwards all of its output (with ``--kill-on-bad-exit=1`` it ends the step
    at the first failure, and what a failed task wrote last may not reach its output)."""
    nodes = list(cluster.nodes)
    hosts = ["--hostfile", paths.relative(write_hostfile(run_dir, nodes, 1))] if hostfile or way != "srun" else []
    cli, target = deepspeed_cli(), [paths.relative(script), *script_args]
    master = ["--master_addr", master_addr(cluster, nodes[0]), "--master_port", str(port)]
    kill = ["--kill-on-bad-exit=1"] if kill_on_bad_exit else []
    if way == "srun":
        node_cmd = shlex.join([cli, *hosts, "--no_ssh", *master, *target]).replace(
            " --no_ssh ", " --no_ssh --node_rank=$SLURM_NODEID ")
        return ["srun", f"--nodes={len(nodes)}", "--ntasks-per-node=1", f"--job-name={job_name}",
                *kill, "bash", "-c", node_cmd]
    if way == "slurm":
        return [cli, *hosts, "--launcher", "slurm", "--no_ssh_check", *master,
                "--launcher_args", " ".join([launcher_args, "--ntasks-per-node=1", *kill, f"--job-name={job_name}"]).strip(),
                *target]
    if way == "openmpi":
        return ["salloc", f"--nodes={len(nodes)}", "--ntasks-per-node=1", f"--job-name={job_name}",
                cli, *hosts, "--launcher", "openmpi", "--no_ssh_check", *master,
                "--launcher_args", f"{launcher_args} --mca btl_tcp_if_include lo".strip(), *target]
    raise ValueError(f"way must be one of {WAYS}, not {way!r}")


def shown(cmd: list[str]) -> str:
    """``cmd`` as a learner would type it: ``deepspeed`` by name, paths relative to the repository."""
    return shlex.join(["deepspeed" if c == deepspeed_cli() else c for c in cmd])


def launch(cluster: SlurmCluster, way: str, *script_args: Any, script: str = SCRIPT, timeout: float = 90.0,
           launcher_args: str = "", quiet: bool = False, **srun_options: bool) -> SlurmLaunch:
    """Launch ``script`` one rank per node on the cluster ``way`` (:data:`WAYS`; ``launcher_args`` and
    ``srun_options`` (``hostfile``, ``kill_on_bad_exit``): see :func:`job_command`), print the command and the
    output, and return what it did. The launch ends on its own; past ``timeout`` seconds the job is cancelled and
    every process of it ended."""
    script_path = resolve_script(script)
    run_dir = new_run_dir(script_path, f"slurm-{way}")
    port, job_name = free_port(), f"course-{run_dir.name[-6:]}"
    cmd = job_command(cluster, way, script_path, [str(a) for a in script_args], run_dir, port, job_name, launcher_args,
                      **srun_options)
    if not quiet:
        print(f"$ {shown(cmd)}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=paths.ROOT, env=launch_env(cluster, run_dir, port), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True, preexec_fn=die_with_parent)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        outcome = _supervise(proc, run_dir, started + timeout)
        if outcome is not None:         # timed out, or stuck after every rank finished
            _cancel(cluster, job_name, proc)
    except BaseException:               # an interrupted cell
        _cancel(cluster, job_name, proc)
        raise
    finally:
        end_run_processes(run_dir)      # the tasks slurmstepd started: their environment names the run folder
        release_shm_buffers(port)
        reader.join(timeout=5)
    output = "".join(lines)
    timed_out = outcome is not None
    if outcome == "stuck":
        output += (f"\n(the course cancelled the launch: every rank had finished, but it had not ended "
                   f"{ENDING_GRACE:.0f} s later)\n")
    code = 124 if timed_out else proc.returncode
    result = SlurmLaunch(way=way, command=shown(cmd), returncode=code,
                         output=output, records=read_records(run_dir), run_dir=run_dir,
                         seconds=time.monotonic() - started, timed_out=timed_out)
    run_folder.launch_log(run_dir).write_text(output)
    if not quiet:
        print(learner_lines(output), flush=True)
        print(f"→ {way}: exit code {exit_status(result.returncode)}{' (timed out)' if timed_out else ''}, {len(result.ranks)} "
              f"rank record(s), {result.seconds:.1f} s; full output in {paths.relative(run_folder.launch_log(run_dir))}")
    return result


def exit_status(code: int) -> str:
    """A launch command's exit status as a shell reports it: above 128 it is 128 + the number of the signal that ended a
    task (``srun`` with ``--kill-on-bad-exit`` ends the tasks still running so once one has failed), e.g.
    ``"143 = 128 + 15 (SIGTERM)"``; else the number alone."""
    import signal

    by = code - 128
    if by <= 0:
        return str(code)
    return f"{code} = 128 + {by}" + (f" ({signal.Signals(by).name})" if by in signal.valid_signals() else "")


ENDING_GRACE = 20.0     # seconds a launch may take to end after every rank finished (srun, mpirun: about 1-3 s here)


def _supervise(proc: subprocess.Popen, run_dir: Path, deadline: float, world_size: int = 2) -> str | None:
    """Wait for the launch command to end by itself (None; its exit code is then the launch's own). ``"timeout"``
    past ``deadline``; ``"stuck"`` when every rank left its finished mark and the command has not ended
    :data:`ENDING_GRACE` seconds later."""
    all_finished = None
    while proc.poll() is None:
        now = time.monotonic()
        if now > deadline:
            return "timeout"
        if all_finished is None and len(run_folder.finished_ranks(run_dir)) >= world_size:
            all_finished = now
        if all_finished is not None and now > all_finished + ENDING_GRACE:
            return "stuck"
        time.sleep(0.1)
    return None


def _cancel(cluster: SlurmCluster, job_name: str, proc: subprocess.Popen) -> None:
    """Cancel the launch's job (by name) and end the command that started it, with everything under it."""
    cluster.command("scancel", f"--name={job_name}", check=False)
    kill_group([proc])


def learner_lines(output: str, limit: int = 40) -> str:
    """What teaches in the output of a launch or a job: the ranks' lines, errors and Slurm's messages, not
    DeepSpeed's INFO and WARNING lines, Python's warnings, or the chatter the runner hides (:data:`.streams.CHATTER`)."""
    chatter = LearnerFilter()
    keep = [ln for ln in output.splitlines() if chatter.shows(f"[output] {ln}") and ln.strip() and "[INFO]" not in ln
            and "[WARNING]" not in ln and "Warning" not in ln]     # every line through the filter: it drops a warning's source line
    return "\n".join(keep[-limit:])


def batch_script(deepspeed: str, script: str, *script_args: Any) -> str:
    """The course's ``sbatch`` script: one rank per node on 2 nodes, a hostfile from ``$SLURM_JOB_NODELIST``, the
    first node's address as master, then ``srun`` of DeepSpeed's launcher once per node (``--no_ssh``, the node rank
    from Slurm; ``--kill-on-bad-exit``: one failed node ends the step), each node's output in its own file (``%N``, the
    host name, and ``%n``, the node's index in the job: nodes on one host share a name). Files go to ``$COURSE_RUN_DIR`` (on your cluster: your job's
    folder); ``$COURSE_MASTER_PORT`` is a free port (on your cluster 29500 does, unless two jobs share a node)."""
    target = shlex.join([script, *(str(a) for a in script_args)])
    return f"""#!/bin/bash
#SBATCH --job-name=ds-course
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:05:00
set -euo pipefail
hostfile="$COURSE_RUN_DIR/hostfile"
scontrol show hostnames "$SLURM_JOB_NODELIST" | sed 's/$/ slots=1/' > "$hostfile"
first=$(head -n 1 "$hostfile" | cut -d' ' -f1)
master=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
srun --kill-on-bad-exit=1 --output="$COURSE_RUN_DIR/node-%N-%n.out" bash -c \\
  "{deepspeed} --hostfile $hostfile --no_ssh --node_rank=\\$SLURM_NODEID --master_addr $master --master_port $COURSE_MASTER_PORT {target}"
"""


@dataclass
class BatchJob:
    """A job submitted with :func:`submit`: its id, its run folder (records, ``job.out``, each node's output)."""
    job_id: str
    run_dir: Path
    script: Path
    port: int = 0               # the port its ranks meet on (COURSE_MASTER_PORT), which names their /dev/shm buffers

    def release(self) -> None:
        """Remove the shared-memory buffers its ranks' CPU all-reduce left (DeepSpeed never unlinks them): call it once
        the job has ended or been cancelled."""
        if self.port:
            release_shm_buffers(self.port)

    @property
    def ranks(self) -> list[SlurmRank]:
        """The ranks' records (:class:`SlurmRank`), read from the run folder now."""
        return ranks_of(read_records(self.run_dir))

    def outputs(self) -> dict[str, str]:
        """``{file name: text}`` of what the job wrote in its run folder (``job.out``, ``node-<name>.out``)."""
        return {p.name: p.read_text(errors="replace") for p in sorted(self.run_dir.glob("*.out"))}


def submit(cluster: SlurmCluster, text: str, *sbatch_args: str, name: str = "sbatch") -> BatchJob:
    """``sbatch`` the script ``text`` (written to a new run folder) with the course's launch environment; the job's own
    output goes to ``job.out`` there. Returns at once: follow it with ``cluster.job(id)`` or ``cluster.wait(id)``."""
    run_dir = new_run_dir(resolve_script(SCRIPT), name)
    path = run_dir / "job.sbatch"
    path.write_text(text)
    port = free_port()
    env = launch_env(cluster, run_dir, port)
    done = cluster.command("sbatch", "--parsable", f"--output={run_dir / 'job.out'}", f"--chdir={paths.ROOT}",
                           *sbatch_args, str(path), env=env)
    return BatchJob(job_id=done.stdout.strip().split(";")[0], run_dir=run_dir, script=path, port=port)


@dataclass
class Placement:
    """What became of a job in the first seconds after ``sbatch`` (:func:`placed`)."""
    submitted: bool
    error: str = ""             # what sbatch said when it did not queue the job
    state: str = ""             # its last JobState: COMPLETED, FAILED, ..., or PENDING when it still waited (then cancelled)
    reason: str = ""            # squeue's reason while it waited ("ReqNodeNotAvail, UnavailableNodes:n2", "Resources")
    nodes: list[str] = field(default_factory=list)      # where it ran
    waited: float = 0.0         # seconds from sbatch to its start, or to the end of the patience


# squeue's reasons that do not clear while the cluster stays as it is: a job pending with one of them waits for an
# administrator (or for ever), not for the scheduler's next look at the queue
STUCK = ("ReqNodeNotAvail", "DRAINED", "BadConstraints", "PartitionNodeLimit", "PartitionConfig")


def placed(cluster: SlurmCluster, text: str, *sbatch_args: str, name: str = "sbatch", patience: float = 30.0,
           timeout: float = 60.0) -> Placement:
    """``sbatch`` the script ``text`` with ``sbatch_args`` and see whether Slurm starts it: a job that pends with a
    reason of :data:`STUCK`, or pends for ``patience`` seconds (its scheduler looks at the queue every second here), is
    cancelled and reported with its reason; one that starts is followed to its end (``timeout``)."""
    began, reason = time.monotonic(), ""
    try:
        job = submit(cluster, text, *sbatch_args, name=name)
    except RuntimeError as refused:
        return Placement(False, error=str(refused).split("): ", 1)[-1].strip(), waited=time.monotonic() - began)
    try:
        while (info := cluster.job(job.job_id)).get("JobState") == "PENDING":
            reason = info["Reason"].replace("_", " ") if info.get("Reason") not in ("None", "", None) else reason
            if time.monotonic() - began > patience or any(word in reason for word in STUCK):
                cluster.command("scancel", job.job_id, check=False)
                return Placement(True, state="PENDING", reason=reason, waited=time.monotonic() - began)
            time.sleep(0.2)
        waited = time.monotonic() - began
        info = cluster.wait(job.job_id, timeout=timeout)
        nodes = cluster.command("scontrol", "show", "hostnames", info.get("NodeList", "")).stdout.split() \
            if info.get("NodeList") not in ("", "(null)", None) else []
        return Placement(True, state=info.get("JobState", ""), reason=reason, nodes=nodes, waited=waited)
    finally:
        job.release()


def preempt_script(deepspeed: str, script: str, *script_args: Any, signal_seconds: int = 90) -> str:
    """A batch script for a job that survives preemption: :func:`batch_script`'s launch of ``script`` with
    ``--checkpoint $COURSE_RUN_DIR/checkpoint``, plus ``--requeue`` (the job may go back to the queue), ``--signal``
    (SIGUSR1 to every process of its steps ``signal_seconds`` before the time limit) and ``--open-mode=append`` (a
    requeued run appends to the output files, which Slurm otherwise truncates). Each node's shell ignores USR1 before it
    starts DeepSpeed's launcher, which would die of it (it handles only SIGINT and SIGTERM); the ranks inherit that,
    and the script installs its own handler. When the ranks leave ``preempted`` beside their checkpoint, the batch
    script requeues the job: the same script runs again from its first line, ``SLURM_RESTART_COUNT`` one higher."""
    target = shlex.join([script, *(str(a) for a in script_args)])
    return f"""#!/bin/bash
#SBATCH --job-name=ds-preempt
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --requeue
#SBATCH --signal=USR1@{signal_seconds}
#SBATCH --open-mode=append
echo "run ${{SLURM_RESTART_COUNT:-0}} of job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"
hostfile="$COURSE_RUN_DIR/hostfile" checkpoint="$COURSE_RUN_DIR/checkpoint"
scontrol show hostnames "$SLURM_JOB_NODELIST" | sed 's/$/ slots=1/' > "$hostfile"
first=$(head -n 1 "$hostfile" | cut -d' ' -f1)
master=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
srun --kill-on-bad-exit=1 bash -c \\
  "trap '' USR1; exec {deepspeed} --hostfile $hostfile --no_ssh --node_rank=\\$SLURM_NODEID --master_addr $master --master_port $COURSE_MASTER_PORT {target} --checkpoint $checkpoint"
if [ -f "$checkpoint/preempted" ]; then
  echo "run ${{SLURM_RESTART_COUNT:-0}}: stopped after step $(cat "$checkpoint/preempted"), saved: requeue"
  rm "$checkpoint/preempted"
  scontrol requeue "$SLURM_JOB_ID"
fi
"""


def signal_job(cluster: SlurmCluster, job: BatchJob, after: str, signal: str = "USR1", timeout: float = 90.0) -> float:
    """Once ``after`` appears in the job's output (``job.out``), send ``signal`` to every process of its steps, as
    ``sbatch --signal`` does before the time limit (``scancel --signal``, without ``--batch``: not to the batch shell);
    the time it was sent. ``TimeoutError`` (the job cancelled) when the line has not come within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while after not in job.outputs().get("job.out", ""):
        if time.monotonic() > deadline:
            cluster.command("scancel", job.job_id, check=False)
            raise TimeoutError(f"job {job.job_id} did not print {after!r} within {timeout:.0f} s: cancelled")
        time.sleep(0.1)
    cluster.command("scancel", f"--signal={signal}", job.job_id)
    return time.time()


def left_of(job: BatchJob, wait: float = 10.0) -> list[str]:
    """``name pid`` of the processes of ``job`` (its run folder in their environment or command line) still alive
    after up to ``wait`` seconds — a job's ``slurmstepd`` takes a moment to end its tasks; then ends any of them."""
    deadline = time.monotonic() + wait
    while True:
        left = [f"{p.name()} {p.pid}" for p in run_processes(job.run_dir) if _alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    end_run_processes(job.run_dir)
    return left


def _alive(p) -> bool:
    try:
        return p.status() != "zombie"
    except Exception:       # noqa: BLE001 - gone while being looked at
        return False
