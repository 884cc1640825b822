"""Notebook 18 executed with papermill on the course's 2-node Slurm cluster: a two-node launch without its hostfile
(node 0 trains alone), the crash and drained-node drills, the learner's job placed past the drained node, a preempted
training job that saves a DeepSpeed checkpoint, requeues itself and resumes where the learner predicted, the
time-limit drill (its job queued at the start runs beside the others; the smoke run reads its deadline and does not
wait for it), and nothing of the cluster left afterwards, nor any file outside the build folder."""
import time
from datetime import datetime

import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.slurm import PreemptRun, SlurmRank
from course_utils.kernel.launch import slurm
from test_slurm import outside_build

NAME = "18_cluster_day"
WHY_NOT = slurm.why_not()
pytestmark = [pytest.mark.notebook,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm cluster here: {WHY_NOT}")]


def test_the_drills_of_a_cluster_day():
    since = time.time() - 1
    m = run_notebook(NAME)
    # --no_ssh without a hostfile: node 0's launcher trains alone in a world of 1, node 1's fails its assertion
    alone = m["no_hostfile"]
    assert [(r.rank, r.node, r.world_size, r.master_addr) for r in as_records(alone["ranks"], SlurmRank)] \
        == [(0, "n1", 1, "127.0.0.1")]
    assert alone["exit_code"] != 0 and "--node_rank is not set correctly" in alone["output"]
    # the crash, the drained node, the job placed past it (exercise 1)
    assert m["crash_exit_code"] != 0 and m["crash_first_failing_rank"] == 1
    assert "n2: task 1: Exited with exit code 1" in m["crash_srun_line"]
    assert "ReqNodeNotAvail" in m["drained_pending_reason"]
    assert m["past_the_drain"] == {"state": "COMPLETED", "nodes": ["n1"]}
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
    # Slurm's clock (whole seconds): eligible cred_expire (5 here) + 1 s after the requeue, started then or soon after
    assert preempt["job_state"] == "COMPLETED" and preempt["restarts"] == 1 and preempt["eligible_after_s"] == 6
    assert 6 <= preempt["requeue_wait_s"] < 60
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
