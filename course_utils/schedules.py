"""DeepSpeed optimizers and learning-rate schedulers, as config sections, and their curves.

The script of notebook 07 builds one engine per entry of :data:`OPTIMIZERS` and :func:`scheduler_sections`
and reads the optimizer class and the learning rate from each; :func:`hf_lr_curve` gives the matching
Hugging Face schedule for the side-by-side comparison.
"""
from __future__ import annotations

from typing import Any

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


# Hugging Face lr_scheduler_type → the DeepSpeed scheduler that corresponds to it.
HF_TO_DS = {"constant_with_warmup": ["WarmupLR (linear)", "WarmupLR (log)"], "linear": ["WarmupDecayLR"]}


def hf_lr_curve(kind: str, steps: int, warmup: int, lr: float = LR) -> list[float]:
    """The learning rate of each step under ``transformers.get_scheduler(kind)`` (read before each step)."""
    import torch
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def max_abs_diff(a: list[float], b: list[float]) -> float:
    """Largest pointwise difference of two equally long curves."""
    if len(a) != len(b):
        raise ValueError(f"curves of different lengths ({len(a)} vs {len(b)}): compare the same number of steps")
    return max(abs(x - y) for x, y in zip(a, b))


def mapping_diffs(ds_curves: dict[str, list[float]], hf_curves: dict[str, list[float]]) -> dict[str, float]:
    """``"constant_with_warmup vs WarmupLR (linear)"`` → max |difference| for every pair of :data:`HF_TO_DS`."""
    return {f"{hf} vs {ds}": max_abs_diff(hf_curves[hf], ds_curves[ds]) for hf, names in HF_TO_DS.items()
            for ds in names}


def plot_lr_curves(curves: dict[str, list[float]], ax: Any = None, title: str = "", **style: Any):
    """Learning rate per step, one line per curve."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    for label, values in curves.items():
        ax.plot(range(len(values)), values, label=label, **style)
    ax.set(xlabel="step", ylabel="learning rate", title=title)
    ax.legend(fontsize=8)
    return ax
