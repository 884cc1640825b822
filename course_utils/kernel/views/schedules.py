"""Notebook 07's curves and tables: DeepSpeed's learning-rate schedules against Hugging Face's, and the
Hugging Face × DeepSpeed optimizer/scheduler matrix the Trainer ran."""
from __future__ import annotations

from typing import Any

from course_utils.common.record import read_as
from course_utils.common.records.schedules import Combo, LrCurve, OptimizerOutcome
from course_utils.kernel.compare import max_abs_series_diff
from course_utils.rank.optimizers import LR
from course_utils.rank.trainer import matrix_cell

# Hugging Face lr_scheduler_type → the DeepSpeed schedulers of notebook 07's section 2 that correspond to it (its
# exercise 2 writes the WarmupDecayLR section with HF's linear shape).
HF_TO_DS = {"constant_with_warmup": ["WarmupLR (linear)", "WarmupLR (log)"], "linear": ["WarmupDecayLR (log)"]}


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


def lag_gap(ds: list[float], hf: list[float], lag: int) -> float:
    """max |DS(s) − HF(s − lag)| over the steps both curves have: how far a DeepSpeed learning-rate curve is from an
    HF one moved ``lag`` steps later (exercise 2)."""
    return max(abs(ds[s] - hf[s - lag]) for s in range(max(lag, 0), min(len(ds), len(hf) + lag)))


def lags_that_fit(ds: list[float], hf: list[float], tol: float = 1e-9, lags: range = range(4)) -> list[int]:
    """The lags (in steps) at which the DeepSpeed curve follows the HF one within ``tol``: none when the shapes
    differ, whatever the lag."""
    return [lag for lag in lags if lag_gap(ds, hf, lag) <= tol]


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


def read_matrix(records: list[dict]) -> dict[str, Combo]:
    """The Trainer matrix of a launch of scripts/07_trainer_matrix.py: combination key → its ``Combo``."""
    return {c.key: c for c in read_as(records, Combo)}


def matrix_table(matrix: dict[str, Combo]) -> list[dict[str, Any]]:
    """Rows (optimizer, scheduler, offload, variant, outcome, optimizer class, adam_w_mode, scheduler class, mean
    loss, the first and last step's loss, the documented table's answer, error message) for display."""
    rows = []
    for key, c in matrix.items():
        opt, sched = matrix_cell(key).split("+")
        rows.append({"optimizer": opt.replace("_opt", "").upper(), "scheduler": sched.replace("_sched", "").upper(),
                     "offload": "+offload" in key, "changed": c.variant or "", "outcome": c.outcome,
                     "optimizer class": c.optimizer_class, "adam_w_mode": c.adam_w_mode,
                     "scheduler class": c.scheduler_class, "train loss": c.train_loss,
                     "loss, first → last step": f"{c.losses[0]:.3f} → {c.losses[-1]:.3f}" if c.losses else "",
                     "documented": DOCUMENTED_TABLE[matrix_cell(key)], "error": (c.error or "")[:160]})
    return rows


DOCUMENTED_TABLE = {           # the Hugging Face documentation's table, as the course's source notes give it
    "hf_opt+hf_sched": "yes", "hf_opt+ds_sched": "yes", "ds_opt+hf_sched": "no", "ds_opt+ds_sched": "yes"}


def optimizer_table(records: list[dict]):
    """What deepspeed.initialize built from each optimizer section (rank 0), indexed by label."""
    import pandas as pd

    return pd.DataFrame(read_as(records, OptimizerOutcome)).set_index("label")


def read_lr_curves(records: list[dict]) -> dict[str, list[float]]:
    """Scheduler label → the learning rate the engine used at each step (rank 0)."""
    return {c.label: c.lr for c in read_as(records, LrCurve)}


def read_betas(records: list[dict]) -> dict[str, list[list[float]]]:
    """Scheduler label → Adam's [beta1, beta2] at each step (rank 0)."""
    return {c.label: c.betas for c in read_as(records, LrCurve)}


def flat_from(values: list[float], rel: float = 1e-9) -> int:
    """The first step from which every value equals the last one."""
    import math

    step = len(values) - 1
    while step > 0 and math.isclose(values[step - 1], values[-1], rel_tol=rel, abs_tol=1e-15):
        step -= 1
    return step


def schedule_ends(curves: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per curve: its first two learning rates, its peak (and the step of it), its last value and the step from
    which it stays there."""
    return {label: {"step 0": lr[0], "step 1": lr[1], "peak": max(lr), "peak at step": lr.index(max(lr)),
                    "last": lr[-1], "flat from step": flat_from(lr)} for label, lr in curves.items()}
