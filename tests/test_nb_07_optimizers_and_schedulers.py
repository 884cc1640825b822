"""Notebook 07 executed with papermill; optimizer classes, LR curves and the HF/DS matrix asserted."""
import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.schedules import Combo
from course_utils.kernel import hardware
from course_utils.rank.optimizers import ADAM_CASES, LR
from course_utils.rank.trainer import OFFLOAD_VARIANTS, combo_key

NAME = "07_optimizers_and_schedulers"
pytestmark = pytest.mark.notebook

SGD, KEEP_TORCH = (combo_key(True, True, True, v) for v in OFFLOAD_VARIANTS)
SGD_CONTROL = combo_key(True, True, False, "optim=sgd")      # the same argument without offload: torch's SGD steps


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    matrix = {f"{o}_opt+{s}_sched{x}" for o in ("hf", "ds") for s in ("hf", "ds") for x in ("", "+offload")}
    combos = {c.key: c for c in as_records(m["combos"], Combo)}
    assert set(combos) == matrix | {SGD, KEEP_TORCH, SGD_CONTROL}
    assert all(c.outcome == "ok" for c in combos.values()), {k: c.error for k, c in combos.items()}
    assert m["matrix_world_size"] == [hardware.detect().default_procs], "the Trainer must see every rank"
    assert m["linear_like_hf_max_gap"] <= 1e-9, "exercise 2's section follows HF's linear schedule one step later"
    assert m["lag_behind_hf"] == 1
    assert m["linear_like_hf_world_size"] == hardware.detect().default_procs

    # which optimizer steps: DeepSpeed's config path, and accelerate's swap of an HF optimizer under offload
    classes = {k: c.optimizer_class for k, c in combos.items()}
    adamw = {k: c.adam_w_mode for k, c in combos.items()}
    assert classes["hf_opt+hf_sched"] == "AdamW" and classes["ds_opt+ds_sched"] == "FusedAdam"
    assert {classes[k] for k in matrix if k.endswith("+offload")} == {"DeepSpeedCPUAdam"}
    assert adamw["hf_opt+hf_sched+offload"] is True, "torch AdamW → DeepSpeedCPUAdam(adamw_mode=True)"
    assert classes[SGD] == "DeepSpeedCPUAdam" and adamw[SGD] is False, "any other optimizer → CPU Adam, L2 mode"
    assert classes[KEEP_TORCH] == "AdamW", "zero_force_ds_cpu_optimizer=false keeps the torch optimizer"
    # every run learns; the loss depends on the schedule and on SGD against Adam, not on which Adam stepped
    assert classes[SGD_CONTROL] == "SGD"
    assert all(c.losses[-1] < c.losses[0] - 0.5 for k, c in combos.items() if k != SGD_CONTROL), "every Adam learns"
    loss = {k: c.train_loss for k, c in combos.items() if k != SGD_CONTROL}
    sched = {k: c.scheduler_class for k, c in combos.items() if k != SGD_CONTROL}
    by_sched = {s: [loss[k] for k in loss if sched[k] == s] for s in set(sched.values())}
    assert set(by_sched) == {"LambdaLR", "WarmupDecayLR"}
    for values in by_sched.values():
        assert values == pytest.approx([values[0]] * len(values), rel=1e-6)
    assert combos[SGD_CONTROL].train_loss > loss[SGD] + 0.1, "torch's SGD trains unlike the Adam it is swapped for"
    assert abs(by_sched["LambdaLR"][0] - by_sched["WarmupDecayLR"][0]) > 1e-4, "the updates must show in the loss"

    outcomes, opt_classes, final = m["optimizer_outcomes"], m["optimizer_classes"], m["optimizer_final_losses"]
    assert opt_classes["Adam + offload"] == "DeepSpeedCPUAdam"
    assert opt_classes["Adam torch_adam=true + offload"] == "AdamW", "torch_adam is tested before offload"
    assert opt_classes["Adam torch_adam=true"] == "AdamW" and opt_classes["Adam"] == "FusedAdam"
    # exercise 1's classic Adam (adam_w_mode false): torch_adam gives torch's Adam, offload or not; offload alone CPU Adam
    assert [opt_classes[label] for label in ADAM_CASES.values()] == ["FusedAdam", "Adam", "DeepSpeedCPUAdam", "Adam"]
    assert final["Adam"] == pytest.approx(final["AdamW"], rel=1e-7), "Adam is AdamW by default"
    assert abs(final["Adam adam_w_mode=false"] - final["AdamW"]) > 1e-5
    assert outcomes["OneBitAdam"] == "AssertionError", "0.19.8 no longer ships OneBitAdam"
    held_out = m["optimizer_held_out_losses"]        # one fixed batch no step trained on, before and after
    assert set(held_out) == {k for k, v in outcomes.items() if v == "ok"}
    assert all(after < before for before, after in held_out.values()), held_out
    if not hardware.detect().is_gpu:
        assert outcomes["Lamb"] == "ValueError", "FusedLamb has no CPU op"

    curves, end = m["lr_curves"], m["decay_end"]
    peak = max(curves["WarmupLR (linear)"])
    increment = [b - a for a, b in zip(curves["WarmupLR (linear)"][1:], curves["WarmupLR (linear)"][2:])][0]
    raw, shifted = m["schedule_mapping_max_abs_diff"], m["schedule_mapping_shifted_diff"]
    yours = "linear vs your section (exercise 2)"
    assert raw[yours] == pytest.approx(increment, rel=1e-6), "one step apart = one increment"
    assert shifted[yours] < 1e-12 and shifted["constant_with_warmup vs WarmupLR (linear)"] < 1e-12
    for log in ("constant_with_warmup vs WarmupLR (log)", "linear vs WarmupDecayLR (log)"):
        assert shifted[log] > 0.05 * peak, f"the log warm-up has another shape: {log}"
    assert curves["WarmupDecayLR (log)"][-1] < 0.2 * peak and max(curves["OneCycle"]) == pytest.approx(peak)
    lr_range = curves["LRRangeTest"]
    assert all(b > a for a, b in zip(lr_range, lr_range[1:])), "LRRangeTest only grows"
    # the warm-up schedulers repeat their minimum once; LRRangeTest and OneCycle move from the second step
    for label, lr in curves.items():
        assert (lr[1] == lr[0]) == label.startswith("Warmup"), label
    # WarmupDecayLR ends at warmup_min_lr (lr / 10 in its section) at iteration total_num_steps (step end + 1);
    # WarmupCosineLR at cos_min_ratio (0.1) × lr, one iteration earlier (it counts from iteration − warmup + 1)
    for label, floor_step in (("WarmupDecayLR (min_lr, ends early)", end + 1), ("WarmupCosineLR", end)):
        lr = curves[label]
        assert lr[floor_step:] == pytest.approx([LR / 10] * (len(lr) - floor_step), rel=1e-9), label
        assert lr[floor_step - 1] > lr[floor_step] * (1 + 1e-6), f"{label} reaches its floor at step {floor_step}"
    assert LR * 0.9 < max(curves["WarmupCosineLR"]) < LR, "the cosine's first point is one step past the peak"
    assert m["warmup_cosine_first_lrs"] == [0.0, pytest.approx(0.5 * LR)], "the constructor sets 0, not warmup_min_ratio × lr"

    betas = m["one_cycle_betas"]
    assert {tuple(b) for b in betas["OneCycle"]} == {(0.9, 0.999)}, "cycle_momentum=False leaves the betas alone"
    cycled, lr = betas["OneCycle (cycle_momentum)"], curves["OneCycle (cycle_momentum)"]
    assert {b[1] for b in cycled} == {0.99}, "cycling momentum overwrites beta2 with 0.99"
    assert min(b[0] for b in cycled) == pytest.approx(0.8) and max(b[0] for b in cycled) == pytest.approx(0.9)
    assert cycled[lr.index(max(lr))][0] == pytest.approx(0.8), "beta1 is lowest where the LR is highest"
    assert cycled[0][0] == pytest.approx(0.8) and cycled[1][0] > cycled[0][0], "the constructor starts at cycle_min_mom"
