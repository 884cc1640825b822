"""A real 2-node Slurm cluster on one machine, for the cluster lessons (notebooks 14 and 18), started and stopped like the
course's sshd (:mod:`.sshd`).

On a cluster, ``sbatch`` hands a job script to ``slurmctld``, which picks nodes and has each node's ``slurmd`` start
its tasks; ``srun`` starts one task per node inside the job. Here every daemon runs on this machine, as root:

- ``munged`` with a key of its own (Slurm's daemons and commands prove who they are with munge credentials), its
  socket, pid, seed and log files in the cluster's folder;
- ``slurmctld`` and one ``slurmd -N <node>`` per node (``n1``, ``n2``), each on a free port of 127.0.0.1, with the
  ``slurm.conf`` of :func:`slurm_setup.write_config` (no cgroup plugin, so it runs in a container too);
- the folder is ``build/slurm/cluster-<port>-<id>/``: state, spool, logs, sockets and pid files, nothing elsewhere.

Slurm's commands find this cluster through ``SLURM_CONF`` (:attr:`SlurmCluster.env`). :meth:`SlurmCluster.stop`
cancels every job, ends every daemon and every process whose environment names this ``slurm.conf`` (the
``slurmstepd`` of a job and its tasks, which leave ``slurmd``'s process tree), and removes the folder. So does the end
of the Python process (atexit), and a watchdog process when the one that started the cluster is killed outright.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import psutil

from course_utils.common import paths, reaper
from course_utils.kernel.launch.commands import free_port
from course_utils.kernel.launch.processes import as_processes, die_with_parent, watchdog
from course_utils.kernel.launch.slurm_setup import (SOCKET_MAX, find_tool, make_key, node_config, remove_stale, why_not,
    write_config)

NODES = ("n1", "n2")
CPUS = 4                  # per node: a job of one task per node leaves room for a second job beside it
START_TIMEOUT = 30.0      # seconds until both nodes are idle
__all__ = ["SlurmCluster", "start", "slurm_cluster", "running", "why_not", "NODES", "leftovers"]


@dataclass
class SlurmCluster:
    """A running munged, slurmctld and one slurmd per node, with every file in ``folder``."""

    folder: Path
    nodes: tuple[str, ...]
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    watchdog: subprocess.Popen | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` has ended this cluster."""
        return self._stopped

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF``: Slurm's commands (and the jobs' tasks) reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 30.0, env: dict | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm command (``sinfo``, ``squeue``, ``scontrol``, ``sbatch``, ``srun`` ...) against this cluster."""
        done = subprocess.run([find_tool(args[0]) or args[0], *args[1:]], env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, cwd=paths.ROOT,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise RuntimeError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
        return done

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as ``sinfo`` reports it (``idle``, ``alloc``, ``mix``, ``drain``, ``down*``, ...)."""
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
        return dict(zip(out[::2], out[1::2]))

    def job(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job -o``'s fields of a job (``JobState``, ``Reason``, ``ExitCode``, ``NodeList``, ...),
        kept by slurmctld ``MinJobAge`` seconds after the job ended; {} once it is gone."""
        done = self.command("scontrol", "show", "job", "-o", str(job_id), check=False)
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout)) if done.returncode == 0 else {}

    def wait(self, job_id: int | str, until: Sequence[str] = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED",
                                                             "NODE_FAIL", "OUT_OF_MEMORY"),
             timeout: float = 120.0) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job's state is one of ``until`` (``PENDING``: with a reason); its fields. ``TimeoutError``
        (the job cancelled) when it is not there within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in until and (info["JobState"] != "PENDING" or info.get("Reason") not in ("None", "")):
                return info             # a pending job once the scheduler has given its reason
            if time.monotonic() > deadline:
                self.command("scancel", str(job_id), check=False)
                raise TimeoutError(f"job {job_id} still {info.get('JobState', 'unknown')} after {timeout:.0f} s "
                                   f"(reason {info.get('Reason', '?')}): cancelled")
            time.sleep(0.25)

    def settled(self, job_id: int | str, timeout: float = 30.0) -> dict[str, str]:
        """:meth:`job`'s fields, read again while the job is ``COMPLETING``: slurmctld has ended it (its time limit, a
        ``scancel``) and its processes are being ended (SIGTERM, SIGKILL ``KillWait`` seconds later); the state it
        ended in (``TIMEOUT``, ``CANCELLED``, ...) comes once they are gone. Any other state is returned at once.
        ``TimeoutError`` when it is still completing after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (info := self.job(job_id)).get("JobState") == "COMPLETING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still COMPLETING after {timeout:.0f} s: its processes did not end "
                                   f"(the nodes' logs: cluster.log('slurmd-n1'))")
            time.sleep(0.1)
        return info

    def completion(self, job_id: int | str, wait: float = 0.0) -> dict[str, str]:
        """The job's line in ``jobcomp.txt`` (``JobCompType=jobcomp/filetxt``: slurmctld appends one line per ended
        job, the record ``sacct`` reads where no slurmdbd keeps accounting), as a dict; {} before it ends (looked for
        again for up to ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                lines = (self.folder / "jobcomp.txt").read_text().splitlines()
            except OSError:
                lines = []
            for line in lines:
                fields = dict(re.findall(r"(\w+)=(\S*)", line))
                if fields.get("JobId") == str(job_id):
                    return fields
            if time.monotonic() >= deadline:
                return {}
            time.sleep(0.1)

    def log(self, daemon: str = "slurmctld") -> str:
        """A daemon's log (``slurmctld``, ``slurmd-n1``, ``slurmd-n2``, ``munged``)."""
        try:
            return (self.folder / "log" / f"{daemon}.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Cancel every job, end every process of this cluster (daemons, job steps, tasks), remove its folder."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            try:
                self.command("scancel", "--full", "--quiet", "--user", "root", check=False, timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # The watchdog last: a kernel that Jupyter kills while this runs (at its exit, atexit calls this) leaves the
        # rest to it. Until then it is spared (its command line names the folder).
        end_cluster(self.folder, spare=self.watchdog.pid if self.watchdog is not None else None)
        for p in self.processes.values():
            p.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()


def start(nodes: Sequence[str] = NODES, timeout: float = START_TIMEOUT) -> SlurmCluster:
    """Start munged, slurmctld and one slurmd per node in a new folder, on free ports, and wait until every node is
    idle. Raises RuntimeError with the reason (and the daemons' logs) when it cannot."""
    reason = why_not()
    if reason:
        raise RuntimeError(reason)
    root = paths.build_dir() / "slurm"
    remove_stale(root)
    ports = {"slurmctld": free_port(), **{node: free_port() for node in nodes}}
    folder = root / f"cluster-{ports['slurmctld']}-{uuid.uuid4().hex[:6]}"
    if len(str(folder / "munge.socket")) > SOCKET_MAX:
        raise RuntimeError(f"{folder} is too long a path for munged's socket (a unix socket path holds at most "
                           f"{SOCKET_MAX} bytes): set COURSE_BUILD_DIR to a shorter folder")
    folder.mkdir(parents=True)
    folder.chmod(0o755)              # munged wants the folder of its socket to be reachable by everyone
    cluster = SlurmCluster(folder=folder, nodes=tuple(nodes), ports=ports)
    atexit.register(cluster.stop)
    try:
        _start_daemons(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextmanager
def slurm_cluster(nodes: Sequence[str] = NODES, timeout: float = START_TIMEOUT) -> Iterator[SlurmCluster]:
    """``with slurm_cluster() as cluster: cluster.command("srun", "-N", "2", "hostname")``: for the block only."""
    cluster = start(nodes, timeout)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def running(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """``with running(cluster) as here:``: ``cluster`` while it runs; once it has been stopped (a cell run again after
    the cluster's last lesson), a new cluster of the same nodes for the block only, stopped when the block ends."""
    if not cluster.stopped:
        yield cluster
        return
    print("(the cluster was stopped: a new one runs this cell, and stops at its end)", flush=True)
    with slurm_cluster(cluster.nodes) as fresh:
        yield fresh


def _start_daemons(cluster: SlurmCluster, timeout: float) -> None:
    folder = cluster.folder
    key = make_key(folder / "munge.key")
    write_config(folder, cluster.ports, cluster.nodes, CPUS)
    for node in cluster.nodes:
        (folder / "spool" / node).mkdir(parents=True, exist_ok=True)
    cluster.watchdog = watchdog("call", "course_utils.kernel.launch.slurm:end_and_remove", str(folder))
    # --force: munged refuses root and a key or socket folder it finds too open without it; -F: in front
    _spawn(cluster, "munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={folder / 'munge.socket'}",
                               f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'log' / 'munged.log'}",
                               f"--seed-file={folder / 'munged.seed'}"])
    _until(lambda: (folder / "munge.socket").exists(), cluster, "munged", timeout)
    conf = str(cluster.conf)
    _spawn(cluster, "slurmctld", ["slurmctld", "-D", "-i", "-f", conf])     # -i: no state from an earlier run
    for node in cluster.nodes:
        _spawn(cluster, f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(node_config(folder, node))])
    _until(lambda: _all_idle(cluster), cluster, "the nodes", timeout)


def _spawn(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    with open(cluster.folder / "log" / f"{name}.out", "ab") as out:
        cluster.processes[name] = subprocess.Popen(
            [find_tool(argv[0]) or argv[0], *argv[1:]], env=cluster.env, cwd=cluster.folder, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)


def _all_idle(cluster: SlurmCluster) -> bool:
    try:
        states = cluster.node_states()
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return sorted(states) == sorted(cluster.nodes) and set(states.values()) == {"idle"}


def _until(ready, cluster: SlurmCluster, what: str, timeout: float) -> None:
    """Poll ``ready()`` until it holds; RuntimeError with the daemons' output when one exits or time is up."""
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [n for n, p in cluster.processes.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                             for p in sorted((cluster.folder / "log").glob("*")))
            raise RuntimeError(f"{what} did not start ({', '.join(dead) + ' exited' if dead else f'{timeout:.0f} s'}):"
                               f"\n{logs}")
        time.sleep(0.1)


def cluster_pids(folder: Path) -> list[int]:
    """Live processes of the cluster in ``folder``: the daemons (its path on their command line) and whatever
    carries one of its ``slurm.conf`` files in ``SLURM_CONF`` (job steps, their tasks, Slurm commands; a node's
    slurmstepd carries that node's ``etc/<node>/slurm.conf``, and its command line names no folder)."""
    return reaper.marked(f"SLURM_CONF={folder}/", str(folder), prefix=True)


def cluster_processes(folder: Path) -> list[psutil.Process]:
    """:func:`cluster_pids` as processes (for the notebook and the tests: names, states)."""
    return as_processes(cluster_pids(folder))


def end_cluster(folder: Path, grace: float = 3.0, spare: int | None = None) -> None:
    """SIGTERM every process of the cluster but ``spare``, SIGKILL what is left after ``grace`` seconds; again while
    any remain (a slurmd may start a step while it is being ended): :func:`course_utils.common.reaper.end`."""
    reaper.end(lambda: [pid for pid in cluster_pids(folder) if pid != spare], grace=grace)


def end_and_remove(folder: str) -> None:
    """The cluster's watchdog, when the process that started it died: end the cluster, remove its folder."""
    end_cluster(Path(folder))
    shutil.rmtree(folder, ignore_errors=True)


def leftovers(root: Path | None = None) -> list[str]:
    """``name pid`` of every munged, slurmctld, slurmd and slurmstepd still running of a cluster under ``root``
    (default: this build folder's ``slurm/``), found by its path in their command line or ``SLURM_CONF``: for the
    tests, which expect none (another checkout's or test session's clusters are not theirs)."""
    mark, found = f"{root or paths.build_dir() / 'slurm'}/cluster-", []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] in ("munged", "slurmctld", "slurmd", "slurmstepd") and (
                    mark in " ".join(p.info["cmdline"] or ()) or mark in p.environ().get("SLURM_CONF", "")):
                found.append(f"{p.info['name']} {p.pid}")
        except (psutil.Error, OSError):
            pass
    return found
