"""Fast unit tests of the precision helpers, the HF/DS combination configs and the "auto" tables."""
from types import SimpleNamespace

import torch

from course_utils.kernel import configs
from script_modules import load_script
from course_utils.common import paths
from course_utils.common.records.precision import GRAD_MESSAGE_MIN_BYTES, EngineDtypes, EngineLr
from course_utils.rank import trainer
from course_utils.rank.data import random_batch
from course_utils.rank.engine import dtype_name
from course_utils.rank.scaffolding import read_config
from course_utils.kernel.views import precision
from course_utils.kernel.views import trainer as trainer_views


def test_overflow_table_shows_the_fp16_pitfall():
    rows = {r["dtype"]: r for r in precision.overflow_table()}
    assert rows["float32"]["finite"] and rows["bfloat16"]["finite"]
    assert not rows["float16"]["finite"]
    assert rows["float32"]["max |logit|"] > precision.FP16_MAX > rows["float16"]["max |activation|"]


def test_skipped_steps_and_dtype_names():
    assert precision.skipped_steps([True, False, True]) == [0, 2]
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(None) is None


def test_doublings_count_the_clean_steps_before_each():
    trace = SimpleNamespace(scale=[8, 8, 4, 4, 4, 8, 8, 16],
                            overflow=[True, True, False, False, False, False, False, False])
    assert precision.doublings(trace) == [(5, 3), (7, 5)]
    assert precision.doublings(SimpleNamespace(scale=[4, 4], overflow=[False, False])) == []


def test_held_out_is_compared_at_the_same_number_of_updates():
    skipping = SimpleNamespace(overflow=[True, True, False, True, False], held_out=[1.0, 1.0, 0.9, 0.9, 0.8])
    assert precision.updates_applied(skipping) == [0, 0, 1, 1, 2]
    assert precision.held_out_after_updates(skipping, 2) == 0.8
    assert precision.held_out_after_updates(skipping, 1) == 0.9, "the step that applied the update, not a skipped one"
    row = precision.loss_scaling_summary({"dynamic": SimpleNamespace(scale=[8.0] * 5, **vars(skipping))})["dynamic"]
    assert (row["skipped"], row["updates applied"], row["first clean step"]) == (3, 2, 2)
    assert (row["held-out loss after step 0"], row["held-out loss at the end"]) == (1.0, 0.8)


def test_communication_table_divides_the_gradient_bytes_by_psi():
    row = EngineDtypes(precision="bf16", module="bfloat16", master="float32", grad="bfloat16", forward="bfloat16",
                       loss_scale=1.0, psi=300, grad_allreduce_bytes=600,
                       messages={"all_reduce": {"600": 1, "1": 1, "4": 1}, "all_gather_into_tensor": {"300": 1}})
    [out] = precision.communication_table([row])
    assert out["bytes per element"] == 2.0 and out["all_gather bytes (this rank's shard)"] == 300
    assert out[f"all_reduce < {GRAD_MESSAGE_MIN_BYTES} B (bytes: count)"] == {"1": 1, "4": 1}
    assert not any("apex" in key for key in precision.precision_support()), "DeepSpeed 0.19 has no amp section"


def test_lr_table_marks_the_forced_steps():
    run = EngineLr(precision="bf16", inf_rank=1, inf_steps=[0], lr_start=0.0, overflow=[True, False],
                   skipped_steps=[1, 1], scheduler_iteration=[-1, 0], lr=[0.0, 0.0])
    rows = precision.lr_table(run)
    assert [r["rank 1's loss × inf"] for r in rows] == [True, False] and rows[1]["scheduler iteration"] == 0


def test_06_precision_and_scheduler_configs():
    s = load_script("06_mixed_precision")
    base = read_config(paths.CONFIGS / "06_loss_scaling.json")
    autocast = s.precision_config(base, "torch_autocast bf16")
    assert autocast["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    assert "bf16" not in autocast and "fp16" not in autocast
    bf16 = s.lr_config(base, "bf16")
    assert bf16["bf16"] == {"enabled": True} and "fp16" not in bf16 and bf16["scheduler"] == base["scheduler"]
    assert s.lr_config(base, "fp16")["fp16"] == {"enabled": True, "loss_scale": 1}
    assert "fp16" in base, "the base config is left alone"
    for name, dtype in (("torch_autocast bf16", "bfloat16"), ("torch_autocast fp16", "float16")):
        assert s.precision_config(base, name)["torch_autocast"] == {"enabled": True, "dtype": dtype}


# Notebook 06's exercise 2: the fp16 section that drew the target curve. It lives here, not in a module the notebook
# imports, so that no learner can read it from the course.
TARGET_FP16 = {"loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 4, "hysteresis": 3,
               "consecutive_hysteresis": True, "min_loss_scale": 1}


def test_06_target_curve_is_what_deepspeeds_scaler_draws():
    overflows, scales = precision.target_scale_curve()
    assert precision.scale_curve(TARGET_FP16, overflows) == scales
    assert set(TARGET_FP16) - {"loss_scale"} == set(precision.SCALER_KEYS)
    assert not any(isinstance(v, dict) and "initial_scale_power" in v for v in vars(precision).values()), \
        "no fp16 section of the target in the module the notebook imports"


def test_random_batch_differs_per_rank_and_repeats():
    a, b = random_batch(0, 0), random_batch(0, 1)
    assert not torch.equal(a[0], b[0])
    assert torch.equal(a[0], random_batch(0, 0)[0])


def test_combo_config_removes_the_sections_hf_provides():
    base = {"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}, "zero_optimization": {"stage": 2}}
    cfg = trainer.combo_config(base, hf_opt=True, hf_sched=False, offload=True)
    assert "optimizer" not in cfg and "scheduler" in cfg
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "offload_optimizer" not in trainer.combo_config(cfg, False, False, False)["zero_optimization"]
    assert base == {"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}, "zero_optimization": {"stage": 2}}
    assert len(trainer.combos()) == 8
    assert trainer.combo_key(False, True, True) == "ds_opt+hf_sched+offload"
    variant = trainer.combo_key(True, True, True, "optim=sgd")
    assert variant == "hf_opt+hf_sched+offload [optim=sgd]" and trainer.matrix_cell(variant) == "hf_opt+hf_sched"
    assert set(trainer.OFFLOAD_VARIANTS) == {"optim=sgd", "zero_force_ds_cpu_optimizer=false"}


def test_auto_keys_and_resolution_table():
    written = {"optimizer": {"params": {"lr": "auto", "eps": 1e-8}}, "train_batch_size": "auto"}
    received = {"optimizer": {"params": {"lr": 0.001, "eps": 1e-8}}, "train_batch_size": 16}
    assert configs.auto_keys(written) == ["optimizer.params.lr", "train_batch_size"]
    rows = trainer_views.resolution_table(written, received, [trainer.AutoFill("optimizer.params.lr", 0.001,
                                                                               "learning_rate")])
    assert rows[0] == {"key": "optimizer.params.lr", "written": "auto", "received by DeepSpeed": 0.001,
                       "filled from": "learning_rate"}
    assert rows[1]["filled from"] == "(not filled)"


def test_other_changes_ignores_auto_and_reports_the_rest():
    written = {"steps_per_print": 10, "optimizer": {"params": {"lr": "auto"}}, "stage": 2}
    received = {"steps_per_print": float("inf"), "optimizer": {"params": {"lr": 0.1}}, "stage": 2}
    assert trainer_views.other_changes(written, received) == {"steps_per_print": (10, float("inf"))}


def test_07_schedule_ends_and_matrix_rows():
    from course_utils.kernel.views import schedules

    ends = schedules.schedule_ends({"decay": [0.0, 0.0, 0.5, 1.0, 0.6, 0.2, 0.2, 0.2], "grow": [1.0, 2.0, 3.0]})
    assert ends["decay"] == {"step 0": 0.0, "step 1": 0.0, "peak": 1.0, "peak at step": 3, "last": 0.2,
                             "flat from step": 5}
    assert ends["grow"]["flat from step"] == 2
    from course_utils.common.records.schedules import Combo

    rows = schedules.matrix_table({"ds_opt+hf_sched": Combo(key="ds_opt+hf_sched", outcome="ok"),
                                   "hf_opt+hf_sched+offload [optim=sgd]": Combo(
                                       key="hf_opt+hf_sched+offload [optim=sgd]", outcome="ok", variant="optim=sgd",
                                       optimizer_class="DeepSpeedCPUAdam", adam_w_mode=False)})
    assert [(r["optimizer"], r["scheduler"], r["offload"], r["documented"]) for r in rows] == [
        ("DS", "HF", False, "no"), ("HF", "HF", True, "yes")]
    assert rows[1]["changed"] == "optim=sgd" and rows[1]["adam_w_mode"] is False


def test_07_lag_between_a_deepspeed_and_an_hf_curve():
    from course_utils.kernel.views import schedules

    hf = [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
    late = [0.0] + hf[:-1]                          # the same curve one step later
    assert schedules.lag_gap(late, hf, 1) == 0 and schedules.lag_gap(late, hf, 0) == 0.5
    assert schedules.lags_that_fit(late, hf) == [1]
    assert schedules.lags_that_fit([0.0, 0.0, 0.25, 0.5, 0.75, 1.0], hf) == [], "another shape fits at no lag"


def test_07_optimizer_and_scheduler_sections():
    from course_utils.rank.optimizers import ADAM_CASES, OPTIMIZERS, decay_end, scheduler_sections

    s = load_script("07_optimizers_and_schedulers")
    base = {"train_micro_batch_size_per_gpu": 8}
    for (torch_adam, offload), label in ADAM_CASES.items():
        cfg = s.optimizer_config(base, label)
        assert cfg["optimizer"]["type"] == "Adam" and cfg["optimizer"]["params"].get("torch_adam", False) is torch_adam
        assert cfg["optimizer"]["params"]["adam_w_mode"] is False, "exercise 1 asks about classic Adam"
        assert ("offload_optimizer" in cfg.get("zero_optimization", {})) is offload
    cfg = s.optimizer_config(base, "Adam + offload")
    cfg["zero_optimization"]["stage"] = 3
    assert OPTIMIZERS["Adam torch_adam=true + offload"][1]["zero_optimization"]["stage"] == 2, "configs are copies"
    sections = scheduler_sections(24, 6)
    assert {v["type"] for v in sections.values()} == {"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR",
                                                      "WarmupCosineLR"}
    assert 6 < decay_end(24, 6) < 24 and sections["WarmupCosineLR"]["params"]["total_num_steps"] == decay_end(24, 6)
    hf_shaped = [label for label, v in sections.items() if v["type"] == "WarmupDecayLR"
                 and v["params"].get("warmup_type") == "linear" and v["params"]["warmup_min_lr"] == 0]
    assert not hf_shaped, "notebook 07's exercise 2 (HF's linear shape) must not be a section the course hands out"

