"""DeepSpeed optimizers and learning-rate schedulers as config sections (notebook 07).

scripts/07_optimizers_and_schedulers.py builds one engine per entry of :data:`OPTIMIZERS` and of
:func:`scheduler_sections` and records the optimizer class and the learning rate of each; the notebook
compares them with Hugging Face's schedules (:mod:`course_utils.views.schedules`).
"""
from __future__ import annotations

LR = 0.01

# label → (optimizer section, extra top-level config). Each is tried in a real deepspeed.initialize.
OPTIMIZERS: dict[str, tuple[dict, dict]] = {
    "Adam": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01}}, {}),
    "Adam adam_w_mode=false": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "adam_w_mode": False}}, {}),
    "AdamW": ({"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}}, {}),
    "Adam torch_adam=true": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "torch_adam": True}}, {}),
    "Lamb": ({"type": "Lamb", "params": {"lr": LR, "weight_decay": 0.01}}, {}),
    "OneBitAdam": ({"type": "OneBitAdam", "params": {"lr": LR, "freeze_step": 2}}, {}),
    "Adam + offload": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01}},
                       {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}),
}


def scheduler_sections(steps: int, warmup: int, lr: float = LR) -> dict[str, dict]:
    """One "scheduler" config section per DeepSpeed scheduler (plus WarmupLR's two warm-up shapes)."""
    return {
        "LRRangeTest": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": lr / 100,
                                                          "lr_range_test_step_size": max(1, steps // 8),
                                                          "lr_range_test_step_rate": 1.0,
                                                          "lr_range_test_staircase": False}},
        "OneCycle": {"type": "OneCycle", "params": {"cycle_min_lr": lr / 10, "cycle_max_lr": lr,
                                                    "cycle_first_step_size": steps // 3,
                                                    "decay_step_size": max(1, steps // 6), "decay_lr_rate": 0.5,
                                                    "cycle_momentum": False}},
        "WarmupLR (log)": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                          "warmup_num_steps": warmup}},
        "WarmupLR (linear)": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                             "warmup_num_steps": warmup, "warmup_type": "linear"}},
        "WarmupDecayLR": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                              "warmup_num_steps": warmup, "total_num_steps": steps,
                                                              "warmup_type": "linear"}},
    }
