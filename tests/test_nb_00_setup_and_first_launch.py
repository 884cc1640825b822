"""Notebook 00 executed with papermill; its figures asserted."""
import pytest

from conftest import run_notebook
from course_utils.kernel import hardware

NAME = "00_setup_and_first_launch"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    procs = hardware.detect().default_procs
    assert m["world_size"] == procs
    assert [r["rank"] for r in m["ranks"]] == list(range(procs))
    assert {r["world_size"] for r in m["ranks"]} == {procs}
    assert len({r["pid"] for r in m["ranks"]}) == procs, "each rank must be its own process"
    assert m["accelerator"] == hardware.detect().accelerator
    assert m["all_reduce_sum"] == procs * (procs + 1) / 2
    # most of the first launch passes before a rank says hello: the launchers' and the ranks' imports, not the work
    assert m["first_hello_seconds"] > m["launch_seconds"] / 2
    assert all(0 <= t["work"] < t["imports"] for t in m["launch_timeline"].values()), m["launch_timeline"]
    assert "cpu_adam" in m["ops_compatible"]
    # pip installed DeepSpeed without pre-built ops: every op is compiled just in time; each has its install-time flag
    assert m["ops_prebuilt"] == [] and m["ops_build_flags"]["cpu_adam"] == "DS_BUILD_CPU_ADAM"
    # rank 1 read the file before rank 0 had written it: the error names rank 1 and shows its own traceback
    assert m["failure_first_line"].startswith("Rank 1 failed") and m["failure_names_cause"] is True
    # the exercises' launches: every rank gathered every pid; with the barrier every rank returned (clock time)
    # after rank 0's build of the file was done
    assert m["roll_call_matches_pids"] is True and m["roll_call_world_size"] == procs
    assert m["prepare_fixed"] is True and len(m["prepare_seconds"]) >= 2
    assert m["prepare_every_rank_returned_after_the_build"] is True
