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

    # One test, not two: make test's workers are separate processes, and a second test of this notebook on the
    # other worker would execute the whole notebook again.
    # CUDA_VISIBLE_DEVICES=1 in the launcher's environment with --num_gpus: the runner says it ignores it, and every
    # rank gets the ids 0..N-1 and its own LOCAL_RANK
    assert any(line.startswith("Detected VISIBLE_DEVICES=1 but ignoring it because one or several of "
                               "--include/--exclude/--num_gpus/--num_nodes") for line in m["devices_runner_lines"])
    received = m["devices_received"]
    assert sorted(received) == [str(r) for r in range(procs)]
    assert {v["CUDA_VISIBLE_DEVICES"] for v in received.values()} == {",".join(map(str, range(procs)))}
    assert all(v["LOCAL_RANK"] == r == v["RANK"] and v["WORLD_SIZE"] == str(procs) for r, v in received.items())
    # without a device flag the variable becomes --include, and an id the runner does not count is refused
    n = m["devices_counted"]
    assert f"Detected VISIBLE_DEVICES={n}: setting --include=localhost:{n}" in m["devices_no_flag_lines"]
    assert m["devices_no_flag_error"] == f"ValueError: No slot '{n}' specified on host 'localhost'"
    four = m["devices_four_gpus"]
    assert four["CUDA_VISIBLE_DEVICES=2,3 deepspeed --num_gpus 2 train.py"]["CUDA_VISIBLE_DEVICES of every rank"] == "0,1"
    assert four["deepspeed --include localhost:1,3 train.py"]["CUDA_VISIBLE_DEVICES of every rank"] == "1,3"
    assert four["deepspeed --exclude localhost:0 train.py"]["ranks"] == 3
    assert "Cannot specify num_nodes/gpus" in four["deepspeed --num_gpus 2 --include localhost:1,3 train.py"][
        "GPU of each rank (LOCAL_RANK → id)"]
    # no compiler on PATH: init_distributed's JIT build of the shm op fails, ninja's log says c++ is not found,
    # ds_report still rates the op compatible (only async_io's row turns NO); the compiler back fixes the checks
    assert m["no_compiler_error_first_line"].startswith("RuntimeError: Error building extension 'deepspeed_shm_comm'")
    assert any(line.endswith("c++: not found") for line in m["no_compiler_not_found"])
    assert m["no_compiler_torch_warning"].startswith("Your compiler (c++) is not compatible")
    assert m["no_compiler_compatible"]["deepspeed_shm_comm"] is True and m["no_compiler_compatible"]["async_io"] is False
    assert m["no_compiler_fixed"] is True and m["devices_fixed_ids"] == {"localhost": [0]}
    # ... and with the compiler there, the first launch's CPU ranks loaded the op the course built at set-up
    assert hardware.detect().is_gpu or m["shm_op_loaded_in_first_launch"] is True
