"""Notebook 14 executed with papermill on the course's 2-node Slurm cluster: the learner's sbatch job, DeepSpeed
launched three ways (srun + --no_ssh, --launcher slurm without and with PMIx, --launcher openmpi), and nothing of the
cluster left afterwards, nor any file outside the build folder. (The drills of a cluster day are notebook 18's.)"""
import time

import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.slurm import SlurmRank
from course_utils.kernel.launch import slurm
from test_slurm import outside_build

NAME = "14_your_cluster"
WHY_NOT = slurm.why_not()
pytestmark = [pytest.mark.notebook,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm cluster here: {WHY_NOT}")]


def _ranks(launch: dict) -> list[SlurmRank]:
    return as_records(launch["ranks"], SlurmRank)


def _by_rank(launch: dict) -> list[tuple]:
    return [(r.rank, r.node, r.world_size) for r in _ranks(launch)]


def test_an_sbatch_job_and_deepspeed_under_slurm_three_ways():
    since = time.time() - 1
    m = run_notebook(NAME)
    launches = m["slurm_launches"]
    assert set(launches) == {"srun", "slurm", "slurm (fixed)", "openmpi"}
    for way in ("srun", "slurm (fixed)", "openmpi"):       # one rank on each Slurm node, one world of 2
        assert launches[way]["exit_code"] == 0, (way, launches[way])
        assert _by_rank(launches[way]) == [(0, "n1", 2), (1, "n2", 2)], way
        assert {r.all_reduce for r in _ranks(launches[way])} == {1.0 + 2.0}, way
    # srun + --no_ssh: DeepSpeed's launcher on each node gave the node rank Slurm numbered
    assert [(r.node_rank, r.slurm_nodeid, r.local_rank) for r in _ranks(launches["srun"])] == [(0, 0, 0), (1, 1, 0)]
    assert "--no_ssh --node_rank=$SLURM_NODEID" in launches["srun"]["command"]
    # --launcher slurm without PMI: Open MPI cannot start under srun; with exercise 2's option MPI discovery places the ranks,
    # no node rank, and the local rank counted by host name (both nodes are this machine)
    assert launches["slurm"]["exit_code"] != 0 and not launches["slurm"]["ranks"]
    assert "srun" in launches["slurm"]["error"]
    for way in ("slurm (fixed)", "openmpi"):
        assert [(r.node_rank, r.local_rank) for r in _ranks(launches[way])] == [(None, 0), (None, 1)], way
        assert {r.master_addr for r in _ranks(launches[way])} != {"127.0.0.1"}, "MPI discovery's own address"
    # every launch ended on its own: its exit code is the launcher's, not set by the course
    assert all(not launches[w]["error"] for w in ("srun", "slurm (fixed)", "openmpi"))
    # the exercise's batch job
    assert m["sbatch_job_state"] == "COMPLETED"
    assert m["sbatch_job_nodes"] == 2 and m["sbatch_node_files"] == 2          # 2 ranks on each of 2 nodes: a world of 4
    sbatch = as_records(m["sbatch_ranks"], SlurmRank)
    assert sorted((r.node, r.node_rank, r.local_rank) for r in sbatch) == [("n1", 0, 0), ("n1", 0, 1), ("n2", 1, 0), ("n2", 1, 1)]
    assert {(r.world_size, r.all_reduce) for r in sbatch} == {(4, 1.0 + 2.0 + 3.0 + 4.0)}
    assert not slurm.leftovers()
    assert not outside_build(since), f"Slurm, munge, PMIx or Open MPI wrote outside the build folder: {outside_build(since)}"

