"""Notebook 14 executed with papermill on the course's 2-node Slurm cluster: the learner's sbatch job, DeepSpeed
launched three ways (srun + --no_ssh, --launcher slurm without and with PMIx, --launcher openmpi), the crash and
drained-node drills, a preempted training job that saves a DeepSpeed checkpoint, requeues itself and resumes, the
time-limit drill (its job queued at the start runs beside the others; the smoke run reads its deadline and
does not wait for it), and nothing of the cluster left afterwards, nor any file outside the build folder."""
import time
from datetime import datetime

import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.slurm import PreemptRun, SlurmRank
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


def test_deepspeed_under_slurm_three_ways_and_the_drills():
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
    # --no_ssh without a hostfile: node 0's launcher trains alone in a world of 1, node 1's fails its assertion
    alone = m["no_hostfile"]
    assert [(r.rank, r.node, r.world_size, r.master_addr) for r in _ranks(alone)] == [(0, "n1", 1, "127.0.0.1")]
    assert alone["exit_code"] != 0 and "--node_rank is not set correctly" in alone["output"]
    # the exercise's batch job, the crash, the drained node
    assert m["sbatch_job_state"] == "COMPLETED"
    assert m["sbatch_job_nodes"] == 2 and m["sbatch_node_files"] == 2          # 2 ranks on each of 2 nodes: a world of 4
    sbatch = as_records(m["sbatch_ranks"], SlurmRank)
    assert sorted((r.node, r.node_rank, r.local_rank) for r in sbatch) == [("n1", 0, 0), ("n1", 0, 1), ("n2", 1, 0), ("n2", 1, 1)]
    assert {(r.world_size, r.all_reduce) for r in sbatch} == {(4, 1.0 + 2.0 + 3.0 + 4.0)}
    assert m["crash_exit_code"] != 0 and m["crash_first_failing_rank"] == 1
    assert "n2: task 1: Exited with exit code 1" in m["crash_srun_line"]
    assert "ReqNodeNotAvail" in m["drained_pending_reason"]
    # the preempted job: both ranks caught USR1 and saved after the same step, the batch script requeued the job, and
    # its second run resumed at the next step with the loss the first run took for that step after its save
    preempt = m["preempt"]
    runs = as_records(preempt["runs"], PreemptRun)
    first, again = [r for r in runs if r.restart == 0], [r for r in runs if r.restart == 1]
    assert len(first) == len(again) == 2 and all(r.caught and r.world_size == 2 for r in first)
    saved = {r.saved_after for r in first}
    assert len(saved) == 1 and min(saved) >= 1 and {r.resumed_at for r in again} == {min(saved) + 1}
    assert first[0].steps + again[0].steps == list(range(1, 9)) and not any(r.caught for r in again)
    assert abs(preempt["resumed_loss"] - preempt["uninterrupted_loss"]) <= 1e-6
    assert preempt["resumed_loss"] != first[0].losses[-1]           # a real next step, not the last one again
    assert preempt["job_state"] == "COMPLETED" and preempt["restarts"] == 1 and 5 <= preempt["requeue_wait_s"] < 60
    assert not preempt["queue_left"] and not preempt["processes_left"]
    assert "USR1 caught; checkpoint saved after step" in preempt["output"] and ": requeue" in preempt["output"]
    # the time-limit drill: the smoke run does not wait out the minute (tests/test_slurm.py's extended test does, and so
    # does the notebook in `make course`): slurmctld gave the job a deadline one minute after its start, or, on a
    # machine slow enough to reach the cell after it, ended it there
    drill = m["slurm_timeout_job"]
    assert drill["TimeLimit"] == "00:01:00", drill
    if m["slurm_timeout_state"] == "RUNNING":
        assert m["slurm_timeout_completion"] is None
        assert (datetime.fromisoformat(drill["EndTime"]) - datetime.fromisoformat(drill["StartTime"])).total_seconds() == 60
    else:
        assert m["slurm_timeout_state"] == "TIMEOUT" and m["slurm_timeout_completion"] == "TIMEOUT"   # slurmctld ended it
    assert not slurm.leftovers()
    assert not outside_build(since), f"Slurm, munge, PMIx or Open MPI wrote outside the build folder: {outside_build(since)}"

