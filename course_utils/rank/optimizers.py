"""DeepSpeed optimizers and learning-rate schedulers as config sections (notebook 07).

scripts/07_optimizers_and_schedulers.py builds one engine per entry of :data:`OPTIMIZERS` and of
:func:`scheduler_sections` and records the optimizer class and the learning rate of each; the notebook
compares them with Hugging Face's schedules (:mod:`course_utils.kernel.views.schedules`).
"""
from __future__ import annotations

LR = 0.01

OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}   # ZeRO-2 + CPU optimizer offload

# label → (optimizer section, extra top-level config). Each is tried in a real deepspeed.initialize.
OPTIMIZERS: dict[str, tuple[dict, dict]] = {
    "Adam": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01}}, {}),
    "Adam adam_w_mode=false": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "adam_w_mode": False}}, {}),
    "AdamW": ({"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}}, {}),
    "Adam torch_adam=true": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "torch_adam": True}}, {}),
    "Lamb": ({"type": "Lamb", "params": {"lr": LR, "weight_decay": 0.01}}, {}),
    "OneBitAdam": ({"type": "OneBitAdam", "params": {"lr": LR, "freeze_step": 2}}, {}),
    "Adam + offload": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01}}, OFFLOAD),
    "Adam torch_adam=true + offload": ({"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "torch_adam": True}},
                                       OFFLOAD),
    # classic Adam (L2 weight decay) with torch_adam and with offload: notebook 07's exercise 1 asks for their classes
    "Adam adam_w_mode=false torch_adam=true": (
        {"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "adam_w_mode": False, "torch_adam": True}}, {}),
    "Adam adam_w_mode=false + offload": (
        {"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "adam_w_mode": False}}, OFFLOAD),
    "Adam adam_w_mode=false torch_adam=true + offload": (
        {"type": "Adam", "params": {"lr": LR, "weight_decay": 0.01, "adam_w_mode": False, "torch_adam": True}}, OFFLOAD),
}

# The four (torch_adam, offload) cases of an "Adam" section with "adam_w_mode": false: notebook 07's exercise 1. Its
# table shows the first; the other three are measured for the check only.
ADAM_CASES: dict[tuple[bool, bool], str] = {
    (False, False): "Adam adam_w_mode=false", (True, False): "Adam adam_w_mode=false torch_adam=true",
    (False, True): "Adam adam_w_mode=false + offload", (True, True): "Adam adam_w_mode=false torch_adam=true + offload"}


def decay_end(steps: int, warmup: int) -> int:
    """``total_num_steps`` of the schedules that should be seen to end inside a curve of ``steps`` steps."""
    return max(warmup + 2, steps * 3 // 4)


def scheduler_sections(steps: int, warmup: int, lr: float = LR) -> dict[str, dict]:
    """One "scheduler" config section per DeepSpeed scheduler (plus WarmupLR's two warm-up shapes, WarmupDecayLR
    with a floor, and OneCycle with DeepSpeed's default momentum cycling)."""
    one_cycle = {"cycle_min_lr": lr / 10, "cycle_max_lr": lr, "cycle_first_step_size": steps // 3,
                 "decay_step_size": max(1, steps // 6), "decay_lr_rate": 0.5}
    end = decay_end(steps, warmup)
    return {
        "LRRangeTest": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": lr / 100,
                                                          "lr_range_test_step_size": max(1, steps // 8),
                                                          "lr_range_test_step_rate": 1.0,
                                                          "lr_range_test_staircase": False}},
        "OneCycle": {"type": "OneCycle", "params": {**one_cycle, "cycle_momentum": False}},
        # the same LR cycle with OneCycle's own default, cycle_momentum=True: it rewrites the optimizer's betas
        "OneCycle (cycle_momentum)": {"type": "OneCycle", "params": {**one_cycle, "cycle_momentum": True}},
        "WarmupLR (log)": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                          "warmup_num_steps": warmup}},
        "WarmupLR (linear)": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                             "warmup_num_steps": warmup, "warmup_type": "linear"}},
        # no warmup_type: DeepSpeed's default warm-up, logarithmic as WarmupLR's
        "WarmupDecayLR (log)": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                                    "warmup_num_steps": warmup, "total_num_steps": steps}},
        # ends inside the curve, at warmup_min_lr (not at 0)
        "WarmupDecayLR (min_lr, ends early)": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": lr / 10, "warmup_max_lr": lr, "warmup_num_steps": warmup, "total_num_steps": end,
            "warmup_type": "linear"}},
        # ratios of the optimizer's lr; ends at cos_min_ratio × lr (counting its cosine from iteration − warmup + 1)
        "WarmupCosineLR": {"type": "WarmupCosineLR", "params": {
            "warmup_min_ratio": 0.0, "warmup_num_steps": warmup, "total_num_steps": end, "cos_min_ratio": 0.1,
            "warmup_type": "linear"}},
    }


HELD_OUT_STEP = 10**6          # a batch index of data.random_batch that no training run reaches


def held_out_loss(model, device: str, dtype=None) -> float:
    """The loss of ``model`` (a ``models.tiny_mlp``, or an engine around one; its inputs cast to ``dtype`` if given)
    on one fixed batch of 256 samples that no training step uses, the same on every rank. A step's own loss goes up
    and down with its batch; this one shows what the updates so far achieved (notebooks 06 and 07)."""
    import torch

    from course_utils.rank.data import random_batch

    x, y = random_batch(HELD_OUT_STEP, 0, batch=256)
    with torch.no_grad():
        out = model(x.to(device=device, dtype=dtype or x.dtype))
        return torch.nn.functional.cross_entropy(out.float(), y.to(device)).item()
