"""Notebook 02's training-loss figures: each step's batch loss as every rank measured it, beside what that rank's
``train_step`` returned for logging (scripts/02_train.py records both)."""
from __future__ import annotations

from course_utils.common.record import read_as
from course_utils.common.records.training import TrainLoss


def step_losses(records: list[dict], world_size: int):
    """Two step × rank DataFrames from a launch of scripts/02_train.py: ``own``, the loss of each rank's own batch
    as the script measured it (from the step's logits), and ``returned``, what that rank's ``train_step`` returned."""
    import pandas as pd

    rows = {r: pd.DataFrame(read_as(records, TrainLoss, rank=r)).set_index("step") for r in range(world_size)}
    own = pd.DataFrame({r: t["own"] for r, t in rows.items()})
    returned = pd.DataFrame({r: t["mean"] for r, t in rows.items()})
    return own, returned


def misreported(own, returned, rel: float = 1e-5) -> str:
    """What is wrong with the values ``train_step`` returned, judged against the mean over ranks of the losses the
    ranks measured: '' when every rank returned that mean at every step, else how many steps are off and, for the
    two usual slips (each rank's own loss, the sum over ranks), which one. Never the values themselves."""
    import numpy as np

    got, measured = returned.to_numpy(), own.to_numpy()
    mean = measured.mean(axis=1, keepdims=True)
    wrong = ~np.isclose(got, mean, rtol=rel, atol=0)
    if not wrong.any():
        return ""
    said = (f"at {int(wrong.any(axis=1).sum())} of {len(got)} steps a rank returned something other than the mean "
            "over ranks of the batch losses the ranks measured")
    if np.isclose(got, measured, rtol=rel, atol=0).all():
        said += "; each rank returned the loss of its own batch, which no other rank has"
    elif np.isclose(got, mean * measured.shape[1], rtol=rel, atol=0).all():
        said += f"; your values are {measured.shape[1]} times that mean: the sum over the ranks"
    return said + "."


def plot_loss(own, batches_per_epoch: int, window: int = 10):
    """The mean over ranks of each step's batch loss (thin) and its running mean over ``window`` steps, with the
    epoch boundaries marked: a figure of what the ranks measured, not of what a logging function returned."""
    import matplotlib.pyplot as plt

    mean = own.mean(axis=1)
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(mean.index, mean, lw=0.8, alpha=0.45, label="each step")
    ax.plot(mean.index, mean.rolling(window, min_periods=1).mean(), lw=2, label=f"running mean of {window} steps")
    for boundary in range(batches_per_epoch, int(mean.index.max()), batches_per_epoch):
        ax.axvline(boundary + 0.5, color="grey", ls="--", lw=1)
    ax.set(xlabel="step", ylabel="batch loss (mean over ranks)",
           title=f"training loss, {own.shape[1]} ranks (dashed: a new epoch)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig
