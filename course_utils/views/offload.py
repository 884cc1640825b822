"""Notebook 04's rows and figure: the offload ladder as measured (the ``rung`` records of
scripts/04_offload_ladder.py) and as the formula predicts it."""
from __future__ import annotations

from dataclasses import asdict

from .. import scripts
from ..rank.engine import LADDER
from ..rank.record import read_as
from ..rank.zero_rules import predicted_device_bytes


def ladder_rows(records: list[dict], rank: int = 0) -> list[dict]:
    """The ``rung`` records of one rank, in launch order, as plain rows (one dict per rung)."""
    return [asdict(r) for r in read_as(records, scripts.load("04_offload_ladder").Rung, rank)]


def ladder_prediction(num_params: int, world_size: int, dtype: str) -> dict[str, float]:
    """Accelerator bytes of model states per rung of :data:`LADDER` by the formula, with what each
    rung's offload options move to the host taken off (:func:`zero_rules.predicted_device_bytes`)."""
    return {name: predicted_device_bytes(num_params, stage, world_size, dtype, zero)
            for name, (stage, zero) in LADDER.items()}


def plot_ladder(rows: list[dict]):
    """Seconds per step, model-state bytes (accelerator vs host) and peak RSS along the ladder."""
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    x = range(len(rows))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 3.8))
    a.bar(x, [r["step_seconds"] for r in rows], color="#4C72B0")
    a.set_title("seconds per step (median)")
    dev = [r["device_bytes"] / 2**20 for r in rows]
    b.bar(x, dev, color="#DD8452", label="accelerator")
    b.bar(x, [r["host_bytes"] / 2**20 for r in rows], bottom=dev, color="#8C8C8C", label="host (offloaded)")
    b.set_title("model states per rank (MiB)")
    b.legend(fontsize=8)
    c.bar(x, [r["peak_rss"] / 2**20 for r in rows], color="#55A868")
    c.set_title("peak RSS per rank (MiB)")
    for ax in (a, b, c):
        ax.set_xticks(list(x), names, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    return fig
