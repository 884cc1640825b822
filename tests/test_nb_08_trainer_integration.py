"""Notebook 08 executed with papermill; "auto" resolution, the mismatch error and both launchers asserted."""
import pytest

from conftest import run_notebook
from course_utils import hardware

NAME = "08_trainer_integration"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    procs = hardware.detect().default_procs
    auto = m["auto_filled"]
    assert auto["train_micro_batch_size_per_gpu"] == 4 and auto["gradient_accumulation_steps"] == 2
    assert auto["train_batch_size"] == 4 * 2 * procs, "train_batch_size must count every rank"
    assert auto["optimizer.params.lr"] == auto["scheduler.params.warmup_max_lr"] == 1e-3
    assert auto["zero_optimization.reduce_bucket_size"] == 32 * 32, "hidden_size² of the tiny GPT-2"
    assert auto["scheduler.params.total_num_steps"] == len(m["losses_path"])
    assert m["auto_filled_from"]["gradient_clipping"] == "max_grad_norm"
    assert auto["fp16.enabled"] is False and auto["bf16.enabled"] is False
    assert m["world_size_seen"] == procs
    assert "ds optimizer.params.lr=0.01 vs hf learning_rate=0.001" in m["mismatch_error"]
    assert m["losses_dict"] == pytest.approx(m["losses_path"], rel=1e-6)
    if not hardware.detect().is_gpu:
        assert f"8 != 4 * 2 * {procs}" in m["failure_without_state"], "plain TrainingArguments see world size 1 on CPU"
    z3 = m["zero3_load"]
    assert z3["without HfDeepSpeedConfig"]["local_numel"] == 64 * 32
    assert z3["with HfDeepSpeedConfig"]["local_numel"] == 0
    assert z3["with HfDeepSpeedConfig"]["ds_numel"] == 64 * 32
    assert z3["with HfDeepSpeedConfig"]["partition_numel"] == 64 * 32 // procs
    assert m["accelerate_world_size"] == procs
    assert m["accelerate_losses"] == pytest.approx(m["losses_path"], rel=1e-5), "same script, same run, other launcher"
