"""GPU machines without a GPU: the decisions that differ on a machine with 1, 2 or 8 GPUs, taken for such a machine
described as data (``hardware.describe``, ``COURSE_MACHINE``), and notebook 08 executed end to end with the course told
it is on a 1-GPU machine while its ranks compute on the CPU.

The first GPU run (one H100, 2026-11-26) met three failures; each has a test here that fails without its fix:
the arch list ``9.0a`` that DeepSpeed's JIT builder cannot read, the Trainer in the CPU ranks of a GPU machine (the
ranks still saw the GPU: DeepSpeed's launcher sets ``CUDA_VISIBLE_DEVICES``), and the ops those CPU ranks load,
which ``make ops`` did not build and which shared folders with the CUDA builds.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_notebook
from course_utils.common import devices, paths
from course_utils.kernel import hardware, ops
from course_utils.kernel.launch import environment

MACHINES = {n: hardware.describe(n) for n in (1, 2, 8)}
LAPTOP = hardware.describe(0, cores=2)
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def machine(monkeypatch):
    """Tell this process it is on ``gpus`` × H100 (``COURSE_MACHINE``), as a notebook's kernel would be told."""
    def tell(gpus: int, **environ: str) -> hardware.Hardware:
        monkeypatch.setenv(devices.MACHINE_ENV, json.dumps({"gpus": gpus, "name": "NVIDIA H100 80GB HBM3", "cores": 16}))
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)     # this CPU process's: the kernel of a GPU machine
        monkeypatch.delenv(devices.ACCELERATOR_ENV, raising=False)    # is told neither
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        hardware.detect.cache_clear()
        return hardware.detect()
    yield tell
    hardware.detect.cache_clear()


# ---- placement: which launches keep the GPUs, which run on CPU ranks, and the line that says so -------------------

@pytest.mark.parametrize("gpus", [1, 2, 8])
@pytest.mark.parametrize("procs,min_ranks", [(None, None), (None, 2), (4, None), (None, 4), (1, None)])
def test_a_launch_keeps_the_gpus_when_there_is_one_per_rank(gpus, procs, min_ranks):
    hw = MACHINES[gpus]
    place = hardware.placement(hw, procs, min_ranks)
    want = max(procs or gpus, min_ranks or 0)
    assert place.procs == want
    assert place.cpu_on_gpu_machine == (want > gpus)
    if place.cpu_on_gpu_machine:     # one line, with the why
        assert f"needs {want} ranks" in place.note and f"has {gpus} GPU" in place.note and "nccl" in place.note
    else:
        assert place.note == ""


def test_eight_gpus_run_every_lesson_on_them_and_a_laptop_runs_two_cpu_ranks():
    """The most ranks a launch of the course starts is the manifest's ``ranks``: with 8 GPUs none falls back."""
    from course_utils.tooling import manifest

    most = max(int(entry.get("ranks", 2)) for entry in manifest.load().values())
    assert most == hardware.MOST_RANKS
    assert "CPU ranks" in MACHINES[2].line() and "CPU ranks" not in MACHINES[8].line()
    assert not hardware.placement(MACHINES[8], None, most).cpu_on_gpu_machine
    assert MACHINES[8].default_procs == 8 and MACHINES[1].default_procs == 1
    assert hardware.placement(LAPTOP, None, 2) == hardware.Placement(2)
    assert "1 × NVIDIA H100" in MACHINES[1].line() and "nccl" in MACHINES[1].line()


@pytest.mark.parametrize("cores,world,threads", [(16, 2, 8), (16, 4, 4), (2, 2, 1), (1, 4, 1)])
def test_cpu_ranks_share_the_machine_s_cores(cores, world, threads):
    assert hardware.cpu_ranks_env(world, cores=cores)["OMP_NUM_THREADS"] == str(threads)


# ---- failure 1: TORCH_CUDA_ARCH_LIST=9.0a ------------------------------------------------------------------------

@pytest.mark.parametrize("arch_list,readable", [("9.0a", "9.0"), ("8.0;9.0a", "8.0;9.0"), ("9.0a 10.0a+PTX", "9.0;10.0+PTX"),
                                                ("8.0;9.0", None), ("", None)])
def test_an_arch_list_with_a_letter_suffix_is_made_readable(arch_list, readable):
    assert hardware.readable_arch_list(arch_list) == readable


def test_the_op_builds_and_the_ranks_of_a_hopper_image_get_an_arch_list_deepspeed_reads(machine, tmp_path, capsys):
    """NVIDIA's images set TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed's own builder (the CUDA fused_adam that notebooks 05
    and 07 load on the GPU) must accept what the course hands the op build (this process) and the ranks."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    machine(1, TORCH_CUDA_ARCH_LIST="9.0a")
    said = capsys.readouterr().out
    assert [line for line in said.splitlines() if "TORCH_CUDA_ARCH_LIST" in line] == [
        "TORCH_CUDA_ARCH_LIST='9.0a' → '9.0' for DeepSpeed's op builds and the ranks: its JIT builder reads only digits there."]
    rank_env = environment.rank_environment(tmp_path, 1)
    for env in (dict(os.environ), rank_env):
        builder = FusedAdamBuilder()
        builder.jit_mode = True
        os.environ["TORCH_CUDA_ARCH_LIST"] = env["TORCH_CUDA_ARCH_LIST"]     # (monkeypatch restores it)
        builder.compute_capability_args()          # in JIT mode it leaves torch the list to compile for
        assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0+PTX"


# ---- failure 2: CPU ranks on a GPU machine see the GPU -------------------------------------------------------------

@pytest.mark.parametrize("visible,count", [(None, 2), ("", 0), ("0", 1), ("0,1", 2), ("1,0", 2), ("0,5,1", 1), ("x", 0)])
def test_a_described_machine_s_cuda_reads_cuda_visible_devices_as_cuda_does(visible, count):
    assert devices.visible_gpus(2, visible) == count


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_cpu_rank_of_a_gpu_machine_is_a_cpu_rank_after_deepspeed_s_launcher_set_its_gpus(gpus, machine, tmp_path):
    """The environment the runner gives a 4-rank launch on a machine with fewer GPUs, then what DeepSpeed's launcher
    adds for each rank it starts (its accelerator's ``set_visible_devices_envs``): the rank is a CPU rank, builds
    and loads its ops in the CPU folder, and is not the described machine's kernel."""
    from deepspeed.accelerator import get_accelerator

    hw = machine(gpus)
    place = hardware.placement(hw, None, 4)
    assert place.cpu_on_gpu_machine
    env = environment.rank_environment(tmp_path, 4, hardware.cpu_ranks_env(4, gpu_machine=True))
    get_accelerator().set_visible_devices_envs(env, list(range(4)))      # what deepspeed/launcher/launch.py does
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert devices.is_cpu_rank(env) and env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 4))
    assert env["TORCH_EXTENSIONS_DIR"] == str(paths.torch_extensions_dir("cpu"))
    assert env[devices.SIMULATED_GPUS_ENV] == str(gpus) and not devices.described(env)


def test_the_kernel_of_a_gpu_machine_is_not_a_cpu_rank(monkeypatch):
    monkeypatch.delenv(devices.ACCELERATOR_ENV, raising=False)
    assert devices.device({devices.MACHINE_ENV: '{"gpus": 1}'}) == "cuda"
    assert devices.is_cpu_rank({devices.ACCELERATOR_ENV: "cpu"})
    assert not devices.is_cpu_rank({devices.ACCELERATOR_ENV: "cuda"})
    with pytest.raises(ValueError, match="describes no machine"):
        devices.described({devices.MACHINE_ENV: "one H100"})


# ---- failure 3: the ops of a GPU machine's CPU ranks ---------------------------------------------------------------

def test_a_gpu_machine_builds_the_ops_its_cpu_ranks_load_in_a_folder_of_their_own():
    """Every op a CPU launch of any notebook loads is in a GPU machine's set too (its 2- and 4-rank lessons run on
    CPU ranks there), except async_io (NVMe offload is a one-device launch, on the GPU); and no two builds of one
    op name share a folder."""
    gpu_set = ops.course_ops("cuda")
    for notebook in sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cpu_loads = {op.key for op in ops.for_script(notebook.stem, ops.course_ops("cpu"))} - {"async_io"}
        assert cpu_loads <= {op.key for op in ops.for_script(notebook.stem, gpu_set)}, notebook.stem
    assert {op.device for op in gpu_set} == {"cpu", "cuda"}
    folders = [ops.extensions_dir(op.device) / op.name for op in gpu_set]
    assert len(set(folders)) == len(gpu_set), "a CPU build and a CUDA build of one op in one folder"
    assert len({op.key for op in gpu_set}) == len(gpu_set)
    assert paths.torch_extensions_dir("cpu") != paths.torch_extensions_dir("cuda")
    # 03 measures offload on one GPU only: the CUDA cpu_adam is waited for there, a CPU machine's 03 waits for nothing
    assert "cpu_adam-cuda" in {op.key for op in ops.for_script("03_zero_stages", gpu_set)}
    assert "cpu_adam" not in {op.key for op in ops.for_script("03_zero_stages", ops.course_ops("cpu"))}


def test_make_ops_on_a_gpu_machine_builds_the_cpu_ranks_ops_as_a_cpu_rank_would(machine):
    """On a (described) GPU machine the CPU ranks' ops are built in a process with a CPU rank's environment, into
    the CPU folder, where ``make ops`` on this CPU machine has built them already: found, loaded, and the CUDA builds
    are what is left to build."""
    machine(1)
    assert devices.device() == "cuda"
    assert [op.key for op in ops.missing()] == [op.key for op in ops.CUDA_OPS]
    assert ops.build_one(ops.SHM) == "built"          # loaded in a process of its own, as a CPU rank would


# ---- a whole notebook on a 1-GPU machine --------------------------------------------------------------------------

@pytest.mark.notebook
def test_notebook_08_on_a_one_gpu_machine():
    """Its 2-rank Trainer launches run on CPU ranks (and say so), where the Trainer joins every rank; its one-rank
    launch takes the GPU's place. Before the fix every rank of the CPU launch failed in TrainingArguments."""
    m = run_notebook("08_trainer_integration", machine={"gpus": 1, "name": "NVIDIA H100 80GB HBM3", "cores": 16})
    assert m["template_world_size"] == 2
    assert "4 per rank x 1 accumulation x 2 ranks" in m["template_trained"]
    assert m["world_size_seen"] == 1 and m["training_arguments"]["world_size"] == 1
    assert m["auto_filled"]["train_batch_size"] == 4 * 2 * 1


# ---- the views' GPU branches, on records a GPU rank writes --------------------------------------------------------

def test_the_offload_view_shows_the_gpu_s_own_bytes_beside_the_sides_deepspeed_chose():
    """A ZeRO-2 + offload rung as a GPU rank records it: parameters and gradients on cuda tensors, Adam's states
    on the host. The comparison adds the "on cuda tensors" column a CPU machine's table has not."""
    from course_utils.common.records.offload import Holding, Rung
    from course_utils.kernel.views import offload

    MiB = 2**20
    held = [Holding("params", "flat", "cuda", 4 * MiB, 1), Holding("grads", "grads_in_partition", "cuda", 4 * MiB, 1),
            Holding("optimizer", "DeepSpeedCPUAdam.state", "cpu", 12 * MiB, 3, side="host")]
    rung = Rung(name="stage 2 + offload", rank=0, dtype="fp32", step_seconds=0.1, accelerator="cuda",
                model_state_bytes=20 * MiB, device_bytes=8 * MiB, host_bytes=12 * MiB, accelerator_side_bytes=8 * MiB,
                host_side_bytes=12 * MiB, nvme_bytes=0, held=held, accelerator_peak=9 * MiB, gathered_in_forward=0,
                persistent_numel=0, optimizer="DeepSpeedCPUAdam", loss=1.0)
    table = offload.placement_comparison([rung])
    assert table.loc[("stage 2 + offload", "optimizer"), "predicted"] == "host"
    assert table.loc[("stage 2 + offload", "optimizer"), "on cuda tensors (MiB)"] == 0
    assert table.loc[("stage 2 + offload", "params"), "on cuda tensors (MiB)"] == 4
    assert "on cuda tensors (MiB)" not in offload.placement_comparison([Rung(**{**vars(rung), "accelerator": "cpu"})])


# ---- notebook 16: the limit of a GPU rank, without a GPU -----------------------------------------------------------

def test_a_gpu_rank_of_notebook_16_caps_its_cuda_allocator_and_joins_no_cgroup(monkeypatch, tmp_path):
    """The rank's device decides (course_utils.rank.bigger.apply_limit): on cuda the allocator's fraction is the limit
    over the device's memory, and the cgroup.procs the notebook passed is left alone."""
    import torch
    from deepspeed.accelerator import get_accelerator

    from course_utils.rank import bigger

    total, fractions = 85_045_231_616, []
    monkeypatch.setattr(type(get_accelerator()), "device_name", lambda self, *a: "cuda")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": total})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, *a: fractions.append(f))
    procs = tmp_path / "cgroup.procs"
    limit = bigger.apply_limit(352 * 2**20, str(procs))
    assert (limit.kind, limit.device, limit.device_total) == ("cuda", "cuda", total)
    assert fractions == [352 * 2**20 / total] and not procs.exists()


def test_notebook_16_launches_on_a_gpu_machine_without_memory_cgroups(machine, monkeypatch):
    """A GPU machine where the course cannot make a cgroup (not root) still launches: the GPU rank caps its allocator.
    A CPU machine in the same place skips, with the reason."""
    from contextlib import contextmanager

    from course_utils.kernel.launch import memcap
    from course_utils.kernel.views import bigger

    @contextmanager
    def unavailable(megabytes):
        raise memcap.MemoryCapUnavailable("not root")
        yield
    launched = []
    monkeypatch.setattr(memcap, "memory_cap", unavailable)
    monkeypatch.setattr(bigger, "_launch", lambda args, timeout, quiet: launched.append(args) or ([], None, 1.0))
    machine(1)
    out = bigger.try_sizes("no ZeRO", ["11 M"], 352)
    assert out.skipped is None and len(launched) == 1 and "--cgroup_procs" not in launched[0]
    machine(0)
    out = bigger.try_sizes("no ZeRO", ["11 M"], 352)
    assert "not root" in out.skipped and len(launched) == 1


# ---- the GPU table: launches made by a view's function count as the notebook's -----------------------------------

def _notebook(tmp_path, *cells: str):
    import nbformat

    path = tmp_path / "99_probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), str(path))
    return path


def test_a_notebook_whose_launches_go_through_a_view_has_them_in_its_gpu_line(tmp_path):
    """Notebook 16 launches only through ``bigger.try_sizes`` and ``machine.measure`` (one rank each:
    ``@launch.launches(procs=1)``); its rows once
    read "no DeepSpeed launch". A call of that function under a branch the machine does not take is not counted, and
    other functions of the same module are not launches."""
    from course_utils.tooling import gpu_table

    assert gpu_table.notebook_rows(paths.NOTEBOOKS / "16_bigger_than_your_device.ipynb") == {
        g: "5 launches on 1 GPU" for g in gpu_table.MACHINES}
    probe = _notebook(tmp_path, "from course_utils.kernel.views import bigger",
                      'bigger.try_sizes("no ZeRO", ["11 M"], 352)\nprint(bigger.summary(None))',
                      'if not nb.hardware.is_gpu:\n    bigger.try_sizes("no ZeRO", ["25 M"], 352)')
    assert gpu_table.launches(probe, MACHINES[2]) == [("GPU", 1)]


def test_only_the_slurm_notebooks_have_no_deepspeed_launch_in_the_gpu_table():
    """The table's "no DeepSpeed launch" is true of notebooks 14 and 18 alone (their ranks start under Slurm): any other
    notebook with that row launches in a way the table does not see."""
    from course_utils.tooling import gpu_table

    none = [nb.stem for nb in sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            if gpu_table.launches(nb, MACHINES[1]) == []]
    assert none == ["14_your_cluster", "18_cluster_day"]


def test_a_launch_declaration_takes_only_what_a_placement_needs():
    from course_utils.kernel import launch

    assert launch.launches(procs=1)(lambda: None).course_launch == {"procs": 1}
    with pytest.raises(TypeError, match="timeout"):
        launch.launches(procs=1, timeout=5)


def test_a_gpu_rank_s_out_of_memory_error_reaches_notebook_16_as_out_of_memory():
    """On a GPU the limit does not kill the rank: the capped allocator raises ``torch.OutOfMemoryError``. Through the
    real launcher and runner, the message names the rank and carries the error, and notebook 16 reads the size the
    rank attempted as out of memory (a rank that fails otherwise is "failed")."""
    from course_utils.common.record import read_as
    from course_utils.common.records.bigger import Attempt
    from course_utils.kernel import launch
    from course_utils.kernel.views import bigger

    with pytest.raises(launch.LaunchError) as failed:
        launch.deepspeed(SCRIPTS / "out_of_device_memory.py", procs=1, timeout=120, quiet=True)
    message = str(failed.value)
    assert "Rank 0" in message and "OutOfMemoryError: CUDA out of memory" in message
    attempts = read_as(failed.value.result.records, Attempt)
    assert bigger.statuses(attempts, [], message) == {"25 M": "out of memory"}
    outcome = bigger.Outcome("no ZeRO", 352, None, attempts, [], error=message,
                             statuses=bigger.statuses(attempts, [], message))
    assert "25 M" in bigger.summary(outcome) and "out of memory" in bigger.summary(outcome)
    assert bigger.statuses(attempts, [], "Rank 0 failed (launch exit code 1):\nValueError: bad key") == {"25 M": "failed"}
