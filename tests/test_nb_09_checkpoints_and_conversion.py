"""Notebook 09 executed with papermill; every checkpoint claim asserted on the numbers it measured."""
import pytest

from conftest import run_notebook
from course_utils.kernel import hardware
from course_utils.kernel.launch import memcap

NAME = "09_checkpoints_and_conversion"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    """One execution (a test per notebook: pytest-xdist may place a module's tests on different workers)."""
    m = run_notebook(NAME)
    procs = hardware.placement(hardware.detect(), None, min_ranks=2).procs      # the training launches: min_ranks=2
    assert m["train_world_size"] == procs
    assert m["resume_max_abs_loss_diff"] <= 1e-6, "a resumed fp32 run must repeat the uninterrupted losses"
    # SMOKE: STEPS = 4. client_state (the script's loop step: batches read) and global_steps (DeepSpeed's counter:
    # optimizer steps) both come back from the file; run A accumulates 2 batches per optimizer step, so they differ
    assert m["global_steps_after_load"] == 4 and m["resumed_at"] == 2 * 4
    assert m["resumed_by"] == "yours", "exercise 2 (solution copy): launch B runs the notebook's resume()"
    assert m["loss_last"] < m["loss_first"], "the model must learn during the 2 × STEPS steps"
    assert m["weights_moved_in_layout"] > 1e-4, "the layout checkpoints must hold trained weights, not the initial ones"
    assert m["fp32_export_max_abs_diff"] <= 1e-7, "zero_to_fp32 must rebuild the live fp32 weights"
    assert m["reload_logits_max_abs_diff"] <= 1e-5, "the save_pretrained model must give the live logits"
    assert m["universal_resume_world_size"] == max(1, procs // 2)
    assert m["universal_resume_max_abs_loss_diff"] <= 1e-4, "a universal resume must continue the losses"
    # ds_to_universal: every parameter the optimizer holds gets its states; the tied lm_head.weight, which it holds
    # under transformer.wte.weight, gets only the fallback's fp32.pt
    assert m["universal_weight_only"] == ["lm_head.weight"]
    assert m["universal_with_states"] == m["universal_folders"] - 1
    assert m["cli_safetensors_tied_error"] is True
    refused = [f for f, v in m["weights_only"].items() if v != "ok"]
    assert refused and all("optim_states" in f for f in refused), m["weights_only"]
    check_file_names_per_stage_and_precision(m, procs)
    check_zero3_state_dict_and_16bit_saves(m)
    check_plain_load_on_another_world_size(m, procs)
    check_conversion_under_a_memory_limit(m)


def check_plain_load_on_another_world_size(m: dict, procs: int) -> None:
    """Launch U first tries a plain load_checkpoint of run A's ZeRO-2 checkpoint on its own number of ranks:
    DeepSpeed's _load_zero_checkpoint (runtime/engine.py) refuses; the universal checkpoint then resumes."""
    universal = max(1, procs // 2)
    if universal == procs:
        assert m["plain_load_error"] == ""
        return
    assert m["plain_load_error"] == (
        f"deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of {procs} "
        f"but the current world size is {universal}. Automatic adjustment of ZeRO's optimizer state partitioning with a "
        "new world size is not currently supported.")
    assert m["universal_resume_world_size"] == universal and m["universal_resume_max_abs_loss_diff"] <= 1e-4


def check_conversion_under_a_memory_limit(m: dict) -> None:
    """The whole-model (eager) conversion is killed under the limit, the CLI's lazy sharded one fits, and the limit
    lies between the two peaks with room on both sides."""
    assert 13e6 < m["large_numel"] < 15e6
    if m["convert_skipped"]:                  # no memory cgroup on this machine: the cells said so and moved on
        assert not memcap.available()
        return
    assert m["convert_eager_killed"] == "zero_to_fp32 (eager) was killed by SIGKILL (exit status -9) and left no Python traceback"
    assert m["convert_sharded_fitted"] is True and m["convert_sharded_files"] > 2     # the shards and their index
    peaks = m["convert_peaks"]
    eager, sharded, cap = peaks["whole model (eager)"], peaks["--max_shard_size 8MB"], m["convert_cap_mb"] * 2**20
    assert 1.5 * sharded < cap < eager / 1.5, peaks
    assert eager >= 4 * m["large_numel"] * 0.9, "the whole-model way holds every fp32 weight at once"
    assert m["convert_shards_vs_whole_max_abs_diff"] == 0, "the shards hold the same weights as the whole-model file"


def check_file_names_per_stage_and_precision(m: dict, procs: int) -> None:
    """DeepSpeed's names (engine._get_ckpt_name / _get_zero_ckpt_prefix): bf16 renames the optimizer files only."""
    files = m["files_per_stage"]
    for dtype, prefix in (("fp32", ""), ("bf16", "bf16_")):
        optim = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(procs)]
        assert files[f"{dtype}/0"] == ["mp_rank_00_model_states.pt"]
        for stage in (1, 2):
            assert files[f"{dtype}/{stage}"] == sorted(["mp_rank_00_model_states.pt"] + optim)
        assert files[f"{dtype}/3"] == sorted([f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(procs)] + optim)
    assert m["optimizer_per_stage"]["bf16/0"] == "FP16_Optimizer", "bf16 without ZeRO: the fp16/bf16 wrapper"
    for world in {procs, max(1, procs // 2)}:      # run A and the universal resume's own save, on disk
        assert m["files_other_world_sizes"][f"2/{world}"] == sorted(
            ["mp_rank_00_model_states.pt"] + [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)])
    sizes = m["checkpoint_bytes"]
    for stage in (1, 2, 3):   # the partitions hold fp32 master weights and moments in both precisions
        assert sizes[f"bf16/{stage}"]["optimizer files"] == pytest.approx(sizes[f"fp32/{stage}"]["optimizer files"], rel=0.01)
    half = sizes["bf16/2"]["model-states files"] / sizes["fp32/2"]["model-states files"]
    assert 0.45 < half < 0.6, "stage 1-2 model states hold the module's weights: 2 bytes each in bf16, 4 in fp32"


def check_zero3_state_dict_and_16bit_saves(m: dict) -> None:
    z = m["zero3_state_dict"]
    assert z["just built"]["state_dict_numel"] == 0, "a freshly built ZeRO-3 module holds placeholders only"
    trained = z["after training"]
    assert trained["state_dict_numel"] == trained["persistent_numel"] > m["model_numel"], (
        "after training, exactly the persistent parameters (all of this tiny model, lm_head listed twice) are whole")
    assert z["after training, stage3_param_persistence_threshold=0"] == {"state_dict_numel": 0, "persistent_numel": 0}
    assert m["save16_gather_on"] == {"fp32": True, "bf16": True} and m["save16_gather_off"] is False
    assert m["save16_dtypes"] == {"fp32": ["torch.float32"], "bf16": ["torch.bfloat16"]}
    assert m["save16_fp32_max_abs_diff"] <= 1e-7
    assert m["save16_bf16_vs_master_max_abs_diff"] == 0, "bf16 weights are the fp32 master weights rounded to bf16"
    on, off = m["trainer_save_files"]["gather_on"], m["trainer_save_files"]["gather_off"]
    assert "model.safetensors" in on and "latest" not in on
    assert "latest" in off and not {"model.safetensors", "pytorch_model.bin"} & set(off)
    assert any(f.endswith("_optim_states.pt") for f in off), "the option off leaves a full DeepSpeed checkpoint"
    assert m["trainer_routes_max_abs_diff"] <= 1e-6, "both Trainer routes give the same weights"
