"""Notebook 06 executed with papermill; the dtypes, the bytes on the wire, the overflows, the loss-scale curve
and the engine's learning rate it measured, asserted against what DeepSpeed's code does. Its student copy
(nbgrader's ClearSolutions) runs to the end: the launch cell, which records the learner's prediction, runs
without one; each check raises ExerciseNotDone; every other cell succeeds."""
import pytest

from conftest import run_notebook
from course_utils.kernel import configs, hardware

NAME = "06_mixed_precision"
pytestmark = pytest.mark.notebook

# Bytes per gradient element in the all-reduce: the communication dtype DeepSpeed uses for each precision
# (the training dtype by default; communication_data_type overrides it; torch_autocast: the autocast dtype).
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "bf16+fp32 comm": 4, "torch_autocast bf16": 2, "torch_autocast fp16": 2, "fp16": 2}


def replay(overflows, init_scale, window, hysteresis, min_scale, consecutive=False):
    """The loss scale before each step, by the rules of DynamicLossScaler.update_scale, written out here."""
    scale, left, last_overflow, out = init_scale, hysteresis, -1, []
    for i, overflow in enumerate(overflows):
        out.append(scale)
        if overflow:
            if left == 1:
                scale = max(scale / 2, min_scale)
            else:
                left -= 1
            last_overflow = i
        else:
            if consecutive:
                left = hysteresis
            clean_before = i - last_overflow - 1
            if clean_before > 0 and clean_before % window == 0:
                scale, left = scale * 2, hysteresis
    return out


def warmup_lr(iteration, warmup_min_lr, warmup_max_lr, warmup_num_steps, **_):
    """Linear WarmupLR at a scheduler iteration (-1 = not stepped yet: the minimum)."""
    if iteration < 0:
        return warmup_min_lr
    return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * min(1.0, iteration / warmup_num_steps)


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    config = configs.load("06_loss_scaling.json")[0]
    fp16 = config["fp16"]

    # what the engines held
    modules = m["param_dtypes"]
    assert (modules["fp32"], modules["bf16"], modules["bf16+fp32 comm"]) == ("float32", "bfloat16", "bfloat16")
    assert set(m["master_dtypes"].values()) == {"float32"}, "master weights are fp32 in every precision"
    assert modules["torch_autocast bf16"] == "float32" and m["forward_dtypes"]["torch_autocast bf16"] == "bfloat16"
    # exercise 1's engine the page leaves out: autocast stores nothing in 16 bits and computes the forward in its dtype
    assert (modules["torch_autocast fp16"], m["grad_dtypes"]["torch_autocast fp16"],
            m["forward_dtypes"]["torch_autocast fp16"]) == ("float32", "float32", "float16")
    assert m["forward_dtypes"]["fp32"] == "float32"
    if hardware.detect().fp16:
        assert modules["fp16"] == "float16"
    else:
        assert "fp16" not in modules
        assert m["fp16_engine_error"] == "ValueError: Type fp16 is not supported on your device."

    # the bytes on the wire: ZeRO-1 all-reduces each of the Ψ gradient elements once per step, in the
    # communication dtype; the updated partition (Ψ / world size elements) is all-gathered in the module dtype
    psi, world = m["psi"], m["world_size"]
    assert set(m["grad_allreduce_bytes"]) >= {"fp32", "bf16", "bf16+fp32 comm", "torch_autocast bf16", "torch_autocast fp16"}
    for name, nbytes in m["grad_allreduce_bytes"].items():
        assert nbytes == psi * ELEMENT_BYTES[name], (name, nbytes, psi)
    # engine.communication_data_type: the config's value, else the training dtype; blind to torch_autocast
    said = m["communication_data_type"]
    assert (said["fp32"], said["bf16"], said["bf16+fp32 comm"]) == ("float32", "bfloat16", "float32")
    assert said["torch_autocast bf16"] == "float32" and ELEMENT_BYTES["torch_autocast bf16"] == 2
    if world > 1:
        module_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}
        for name, nbytes in m["allgather_bytes"].items():     # a shard of Ψ / world elements, plus alignment padding
            size = module_bytes[modules[name]]
            assert psi * size <= nbytes * world < (psi + 8 * world) * size, (name, nbytes)

    # dynamic loss scaling: the measured scale follows the rules the notebook states
    trace, overflow = m["loss_scale_trace"], m["loss_scale_overflow"]
    assert trace == replay(overflow, 2.0 ** fp16["initial_scale_power"], fp16["loss_scale_window"],
                           fp16["hysteresis"], fp16["min_loss_scale"])
    assert 3 <= m["fp16_skipped_steps"] < len(trace) - 5, "the too-high initial scale overflows, then recovers"
    assert overflow[:2] == [True, True] and trace[1] == trace[0] > trace[2], "the first overflow only spends hysteresis"
    assert m["doublings"], "the run is long enough for the scale to double"
    assert all((clean - 1) % fp16["loss_scale_window"] == 0 and clean > 1 for _, clean in m["doublings"])
    skipped = m["skipped_by_run"]
    assert skipped["static 16777216"] == len(trace) and skipped["static 1024"] == 0
    # what the skipped steps cost: the held-out loss (a fixed batch no step trains on) falls where steps are applied,
    # never moves where none is, and the dynamic run at its end is where the static one was after as many updates
    held, updates = m["held_out_by_run"], m["updates_by_run"]
    assert set(held["static 16777216"]) == {held["static 16777216"][0]} and updates["static 16777216"] == 0
    assert held["static 1024"][-1] < 0.85 * held["static 1024"][0], "the data has a rule to learn: the loss falls"
    assert updates["dynamic"] == len(trace) - m["fp16_skipped_steps"] and updates["static 1024"] == len(trace)
    assert held["dynamic"][-1] > held["static 1024"][-1], "fewer updates, a higher loss at the end"
    same = m["held_out_same_updates"]
    assert same["dynamic"] == pytest.approx(same["static 1024"], rel=0.05)

    # consecutive_hysteresis, on one overflow pattern
    demo = m["hysteresis_demo"]
    for consecutive in (False, True):
        assert demo[str(consecutive).lower()] == replay(demo["overflow"], 2.0 ** fp16["initial_scale_power"],
                                                        fp16["loss_scale_window"], demo["hysteresis"],
                                                        fp16["min_loss_scale"], consecutive)
    assert demo["true"][-1] > demo["false"][-1], "refilling on clean steps halves less often"

    # the engine's scheduler on skipped steps
    run = m["lr_run"]
    params = config["scheduler"]["params"]
    steps = len(run["lr"])
    skipped_at = [i for i in range(steps) if run["skipped_steps"][i] > (run["skipped_steps"][i - 1] if i else 0)]
    assert skipped_at == [i for i in run["inf_steps"] if i < steps] == [i for i in range(steps) if run["overflow"][i]]
    assert run["skipped_by_rank"] == [skipped_at] * m["world_size"], "one rank's inf skips the step on every rank"
    lr_before, iteration_before, applied = run["lr_start"], -1, 0
    assert lr_before == warmup_lr(-1, **params)
    for i in range(steps):
        if i in skipped_at:
            assert run["lr"][i] == lr_before and run["scheduler_iteration"][i] == iteration_before, i
        else:
            applied += 1
            assert run["scheduler_iteration"][i] == iteration_before + 1 == applied - 1, i
            assert run["lr"][i] == pytest.approx(warmup_lr(applied - 1, **params)), i
            if applied > 1:
                assert run["lr"][i] > lr_before, f"step {i} was applied but the lr did not move"
        lr_before, iteration_before = run["lr"][i], run["scheduler_iteration"][i]
    assert applied >= 3 and len(skipped_at) >= 2

    assert m["amp_config_error"].startswith("DeepSpeedConfigError: NVIDIA Apex AMP integration has been removed")
    assert "torch_autocast" in m["amp_config_error"]
    assert m["nan_pitfall"] == {"float32": True, "bfloat16": True, "float16": False}
    # fp16.auto_cast: DeepSpeed's forward pre-hook casts the positional arguments only: every floating tensor of a dict
    # passed positionally becomes fp16 (integers stay), keyword arguments arrive as they were; bf16 has no such key
    assert m["auto_cast_dtypes"] == {"input_ids": "int64", "target": "float16", "mask": "float16"}
    assert m["auto_cast_kwargs_dtypes"] == {"input_ids": "int64", "target": "float64", "mask": "bfloat16"}
    assert m["bf16_auto_cast_error"].startswith("Extra inputs are not permitted")
    # exercise 2's target: DeepSpeed's scaler from 2^12, halving and doubling
    assert m["scale_target"][0] == 4096 and max(m["scale_target"]) > 4096 and min(m["scale_target"]) < max(m["scale_target"])
