"""Notebook 14's record: what each rank of a Slurm job found (``scripts/14_slurm_ranks.py``)."""
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
