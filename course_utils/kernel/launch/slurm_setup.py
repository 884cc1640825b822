"""What the course's Slurm cluster (:mod:`.slurm`) needs before it starts: its programs, its munge key, its files.

- :data:`TOOLS` and :func:`why_not`: the daemons and commands, and the Debian/Ubuntu package that has each;
- :func:`make_key`: a munge key of the cluster's own (``munged --key-file``), never ``/etc/munge/munge.key``;
- :func:`write_config`: ``slurm.conf`` with every path (state, spool, logs, pid files, the munge socket) in the
  cluster's folder, its own ports, two nodes on loopback, and no cgroup plugin (``proctrack/linuxproc``,
  ``task/none``) so it runs in a container as well;
- :func:`remove_stale`: the folders of clusters killed outright, without their ``stop()``.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
from pathlib import Path

import psutil

from course_utils.kernel.launch.sshd_setup import find_tool

TOOLS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "srun": "slurm-client",
         "sbatch": "slurm-client", "scontrol": "slurm-client", "squeue": "slurm-client", "sacct": "slurm-client"}
INSTALL = "sudo apt-get install slurm-wlm munge openmpi-bin libopenmpi-dev"
SOCKET_MAX = 100           # a unix socket path longer than ~107 bytes cannot be bound


def why_not() -> str | None:
    """None when this machine can run the course's Slurm cluster; else what is missing and how to get it."""
    missing = [tool for tool in TOOLS if not find_tool(tool)]
    if missing:
        return (f"{', '.join(missing)} not found: the Slurm lessons need Slurm and munge (Debian/Ubuntu: {INSTALL}; "
                f"`make setup` does it where it runs as root).")
    if os.geteuid() != 0:
        return ("Slurm's daemons run here as root (slurmd starts every job's tasks as the job's user): run the "
                "course as root, in a container, or on a real cluster.")
    return None


def make_key(path: Path) -> Path:
    """1024 random bytes readable by their owner only: the key munged signs its credentials with."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(1024))
    return path


def write_config(folder: Path, ports: dict[str, int], nodes: tuple[str, ...], cpus: int) -> Path:
    """``slurm.conf`` for a controller and ``nodes`` (one ``slurmd -N <node>`` each) on 127.0.0.1, ``ports``:
    ``{"slurmctld": p, "<node>": p, ...}``; ``cpus`` per node (``config_overrides``: slurmd does not compare them
    with the machine, so nodes on one machine may share its cores). Jobs end in ``jobcomp.txt`` (JobCompType
    filetxt), since without slurmdbd there is no accounting store for ``sacct``."""
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    lines = [
        "# The course's 2-node cluster on one machine (course_utils/kernel/launch/slurm.py). Every path is in this folder.",
        "ClusterName=course",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
        f"SlurmctldPort={ports['slurmctld']}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        # cred_expire: a requeued job waits this long + 1 s before it may start again (default 120 s; 5 is the least)
        f"AuthInfo=socket={folder / 'munge.socket'},cred_expire=5",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}/%n",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",        # no cgroups
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt", f"JobCompLoc={folder / 'jobcomp.txt'}",
        "MpiDefault=none", "SwitchType=switch/none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerParameters=sched_interval=1,bf_interval=1",      # the queue looked at every second (defaults 60 s, 30 s)
        "SlurmdParameters=config_overrides", "ReturnToService=2",
        "OverTimeLimit=0", "KillWait=2", "MinJobAge=600", "InactiveLimit=0", "MessageTimeout=10",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        *(f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname=127.0.0.1 Port={ports[node]} CPUs={cpus} "
          "State=UNKNOWN" for node in nodes),
        f"PartitionName=course Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = folder / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def node_config(folder: Path, node: str) -> Path:
    """A node's own copy of ``slurm.conf``, beside an ``mpi.conf`` of its own: PMIx (``srun --mpi=pmix``) makes a
    folder per job step under ``PMIxCliTmpDirBase`` (``/tmp`` by default), named by user, job and step only, which two
    nodes on one machine would both create; each node gets one in its spool folder instead."""
    etc = folder / "etc" / node
    etc.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "slurm.conf", etc / "slurm.conf")
    (etc / "mpi.conf").write_text(f"PMIxCliTmpDirBase={folder / 'spool' / node}\n")
    return etc / "slurm.conf"


def remove_stale(root: Path, age: float = 60.0) -> None:
    """Remove the folders of clusters that are gone without their ``stop()``: older than ``age`` seconds and no live
    process holding their path on its command line."""
    for folder in root.glob("cluster-*"):
        try:
            if time.time() - folder.stat().st_mtime < age:
                continue
        except OSError:
            continue
        if not any(str(folder) in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"])):
            shutil.rmtree(folder, ignore_errors=True)
