"""Notebook 08 executed with papermill; "auto" resolution, the mismatch error and both launchers asserted."""
import math

import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.trainer import AutoOutside, Zero3Load
from course_utils.kernel import hardware

NAME = "08_trainer_integration"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    procs = hardware.detect().default_procs
    auto, engine, targs = m["auto_filled"], m["engine_view"], m["training_arguments"]
    # what the DeepSpeed engine ended up using, against the TrainingArguments of the script (trainer_settings)
    assert engine["micro_batch"] == 4 and engine["gradient_accumulation_steps"] == 2
    assert engine["train_batch_size"] == auto["train_batch_size"] == 4 * 2 * procs, "train_batch_size counts every rank"
    assert engine["gradient_clipping"] == 1.0 and engine["optimizer"] == "FusedAdam"
    assert engine["lr_scheduler"] == "WarmupDecayLR"
    # WarmupDecayLR with warmup_max_lr ← learning_rate, warmup_num_steps ← 1 (DeepSpeed uses max(2, ·)) and
    # total_num_steps ← the steps; the k-th logged rate is that of iteration k - 1
    total, warmup = len(m["losses_path"]), max(2, auto["scheduler.params.warmup_num_steps"])
    expected = [1e-3 * (it / warmup if it < warmup else max(0.0, (total - it) / (total - warmup)))
                for it in range(total)]
    assert m["learning_rates"] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert max(m["learning_rates"]) == pytest.approx(1e-3), "the peak is the learning_rate argument"
    assert targs["world_size"] == procs, "the Trainer must see every rank"
    assert auto["zero_optimization.reduce_bucket_size"] == 32 * 32, "hidden_size² of the tiny GPT-2"
    assert auto["scheduler.params.total_num_steps"] == len(m["losses_path"])
    assert m["auto_filled_from"]["gradient_clipping"] == "max_grad_norm"
    assert m["auto_filled_from"]["scheduler.params.warmup_num_steps"] == "warmup_steps"
    assert auto["fp16.enabled"] is False and auto["bf16.enabled"] is False
    assert m["world_size_seen"] == procs
    # warmup_num_steps = max(1, get_warmup_steps(40)): a count, a fraction rounded up, at least 1
    assert m["warmup_fill"] == {"3": 3, "0.25": math.ceil(0.25 * 40), "0": 1}
    assert "warmup_ratio" in m["warmup_ratio_error"], "transformers 5 has no warmup_ratio argument"
    # one error names every contradiction, betas and warmup_num_steps included
    mismatch = m["mismatch_error"]
    assert "ds optimizer.params.lr=0.01 vs hf learning_rate=0.001" in mismatch
    assert "ds optimizer.params.betas=[0.9, 0.95] vs hf adam_beta1+adam_beta2=[0.9, 0.999]" in mismatch
    assert "ds scheduler.params.warmup_num_steps=3 vs hf warmup_steps=1" in mismatch
    assert m["losses_dict"] == pytest.approx(m["losses_path"], rel=1e-6)
    # (the smoke run leaves out section 8's launch without the template's CPU step: make course runs it)
    # section 1's course-free script: it trains on every rank, DeepSpeed's batch counting them all, and learns; the
    # logged rates are WarmupLR's from warmup_min_lr 0, log warm-up over 5 steps (the k-th logged: log k / log 5)
    assert m["template_world_size"] == max(procs, 2)
    assert f"train_batch_size {4 * max(procs, 2)} = 4 per rank x 1 accumulation x {max(procs, 2)} ranks" in m["template_trained"]
    rates, losses = m["template_learning_rates"], m["template_losses"]
    assert len(rates) == len(losses) == 30
    warmup = [5e-3 * math.log(k) / math.log(5) for k in range(1, 6)]
    assert rates == pytest.approx(warmup + [5e-3] * 25, rel=1e-3, abs=1e-9)
    assert sum(losses[-5:]) / 5 < losses[0] - 1, "the template's run learns"
    z3 = {z.label: z for z in as_records(m["zero3_load"], Zero3Load)}
    assert z3["without HfDeepSpeedConfig"].local_numel == 64 * 32
    assert z3["with HfDeepSpeedConfig"].local_numel == 0
    assert z3["with HfDeepSpeedConfig"].ds_numel == 64 * 32
    assert z3["with HfDeepSpeedConfig"].partition_numel == 64 * 32 // procs
    # the Trainer's config in a loop without the Trainer: DeepSpeed's own errors, then the two fixes
    tries = as_records(m["auto_outside"], AutoOutside)
    as_written = {t.call: t for t in tries if t.label == "the Trainer's config"}
    for call, entry in (("deepspeed.initialize", "deepspeed/__init__.py:initialize"),
                        ("zero.Init", "deepspeed/runtime/zero/partition_parameters.py:__init__")):
        assert as_written[call].error == "TypeError: '>' not supported between instances of 'str' and 'int'"
        assert as_written[call].where[0] == entry and as_written[call].where[-1] == "deepspeed/runtime/config.py:_batch_assertion"
    filled = next(t for t in tries if t.label.startswith("filled by transformers"))
    assert filled.error is None and filled.train_batch_size == 4 * 2 * procs and filled.reduce_bucket_size == 32 * 32
    walk = [t for t in tries if t.label.startswith("numbers") and t.call == "deepspeed.initialize"]
    assert [t.error for t in walk] == ["ValueError: warmup_num_steps must be a positive integer, got auto",
                                       "TypeError: '>' not supported between instances of 'str' and 'float'",
                                       "ValueError: too many values to unpack (expected 2)", None]
    assert [t.where[0] for t in walk[1:3]] == ["deepspeed/runtime/engine.py:step"] * 2, "these two fail at the first step"
    assert walk[-1].train_batch_size == 4 * 2 * procs and walk[-1].reduce_bucket_size == 500_000_000
    assert walk[-1].fp16 is False and walk[-1].losses == pytest.approx(filled.losses, rel=1e-6)
    assert len(walk[-1].losses) == len(m["losses_path"])
    zero_init = next(t for t in tries if t.label.startswith("numbers") and t.call == "zero.Init")
    assert zero_init.error is None and zero_init.local_numel == 0 and zero_init.ds_numel == 64 * 32
    # two configs that look right: a number in quotes (transformers refuses it, the pre-check names it); a file with a
    # comment and a trailing comma (DeepSpeed reads it, the Trainer's json does not; the pre-check warns or stops)
    looks = m["configs_that_look_right"]
    assert "- ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=4" in looks["quoted_transformers"]
    assert [e.split(":")[0] for e in looks["quoted_doctor"]] == ["train_micro_batch_size_per_gpu"]
    assert looks["commented_deepspeed_stage"] == 2 and looks["commented_doctor_plain_errors"] == []
    assert looks["commented_trainer"].startswith("json.decoder.JSONDecodeError: Expecting property name")
    assert "hjson" in looks["commented_doctor_plain"][0] and "Trainer launch stops" in looks["commented_doctor_trainer"][0]
    # accelerate launch runs in make course only, where the notebook checks its losses against the deepspeed launch
    assert m["accelerate_world_size"] is None and m["accelerate_losses"] is None
