"""The records of notebooks 14 and 18: what each rank of a Slurm job found (``scripts/14_slurm_ranks.py``), and each run of the
preempted job (``scripts/18_preempt.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class SlurmRank(Record, name="slurm_rank"):
    """One rank: DeepSpeed's view (rank, local rank, node rank, world size) next to Slurm's (node name, node id,
    task id), and the all_reduce of rank + 1 over every rank."""
    rank: int
    local_rank: int
    node_rank: int | None       # CROSS_RANK, from DeepSpeed's launcher (--node_rank); None when no launcher ran
    world_size: int
    node: str | None            # SLURMD_NODENAME: the Slurm node that started this task
    slurm_nodeid: int | None    # SLURM_NODEID: the node's index in the job
    slurm_procid: int | None    # SLURM_PROCID: the task's index in the step (under mpirun: of its orted)
    master_addr: str
    master_port: int
    all_reduce: float
    pid: int


@dataclass
class PreemptRun(Record, name="preempt_run"):
    """One rank in one run of the preempted job (``scripts/18_preempt.py``): the steps it trained and their losses
    (averaged over the ranks), whether it caught SIGUSR1, the step its checkpoint was saved after, the step it resumed
    at, and the loss of the step after the save as an uninterrupted run takes it (``--after_save``)."""
    restart: int                # SLURM_RESTART_COUNT: 0 for the first run, 1 once requeued
    rank: int
    world_size: int
    node: str | None
    resumed_at: int | None      # the first step this run trained after load_checkpoint; None when it started fresh
    steps: list[int]
    losses: list[float]
    caught: bool                # the signal reached this rank's handler
    saved_after: int | None     # steps done when the checkpoint was saved; None when it saved none
    after_save: float | None    # loss of step saved_after + 1, taken after the save
