"""Notebook 07's curves and tables: DeepSpeed's learning-rate schedules against Hugging Face's, and the
Hugging Face × DeepSpeed optimizer/scheduler matrix the Trainer ran."""
from __future__ import annotations

from typing import Any

from .. import scripts
from ..compare import max_abs_series_diff
from ..rank.optimizers import LR
from ..rank.record import read_as

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


def mapping_diffs(ds_curves: dict[str, list[float]], hf_curves: dict[str, list[float]]) -> dict[str, float]:
    """``"constant_with_warmup vs WarmupLR (linear)"`` → max |difference| for every pair of :data:`HF_TO_DS`."""
    return {f"{hf} vs {ds}": max_abs_series_diff(hf_curves[hf], ds_curves[ds]) for hf, names in HF_TO_DS.items()
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


def read_matrix(records: list[dict]) -> dict[str, Any]:
    """The Trainer matrix of a launch of scripts/07_trainer_matrix.py: combination key → its ``Combo``."""
    return {c.key: c for c in read_as(records, scripts.load("07_trainer_matrix").Combo)}


def matrix_table(matrix: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows (optimizer, scheduler, offload, outcome, optimizer class, error message) for display."""
    rows = []
    for key, c in matrix.items():
        opt, sched = key.split("+")[:2]
        rows.append({"optimizer": opt.replace("_opt", "").upper(), "scheduler": sched.replace("_sched", "").upper(),
                     "offload": key.endswith("+offload"), "outcome": c.outcome,
                     "optimizer class": c.optimizer_class, "scheduler class": c.scheduler_class,
                     "error": (c.error or "")[:160]})
    return rows


DOCUMENTED_TABLE = {           # the Hugging Face documentation's table, as the course's source notes give it
    "hf_opt+hf_sched": "yes", "hf_opt+ds_sched": "yes", "ds_opt+hf_sched": "no", "ds_opt+ds_sched": "yes"}


def optimizer_table(records: list[dict]):
    """What deepspeed.initialize built from each optimizer section (rank 0), indexed by label."""
    import pandas as pd

    script = scripts.load("07_optimizers_and_schedulers")
    return pd.DataFrame(read_as(records, script.OptimizerOutcome)).set_index("label")


def read_lr_curves(records: list[dict]) -> dict[str, list[float]]:
    """Scheduler label → the learning rate the engine used at each step (rank 0)."""
    return {c.label: c.lr for c in read_as(records, scripts.load("07_optimizers_and_schedulers").LrCurve)}
