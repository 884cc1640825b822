"""Notebook 01's tables and figures: the collectives of every rank, the parallelism families, all_reduce timing."""
from __future__ import annotations

from typing import Callable

from ..rank.distributed import COLLECTIVES, AllReduceTime, CollectiveRow
from ..rank.record import read_as


def collectives_table(records: list[dict]):
    """The ``collectives`` rows of every rank of a launch → a DataFrame indexed by (collective, rank),
    in the order they ran."""
    import pandas as pd

    df = pd.DataFrame(read_as(records, CollectiveRow, rank=None))
    df["collective"] = pd.Categorical(df["collective"], COLLECTIVES, ordered=True)
    return df.sort_values(["collective", "rank"]).set_index(["collective", "rank"])


def plot_parallelism_families():
    """Four panels: how data, tensor (model) and pipeline parallelism split a 4-layer model over
    devices, and how 3D parallelism combines them; ZeRO marked as data parallelism whose
    parameters, gradients and optimizer states are partitioned instead of replicated."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    layers = 4

    def model(ax, x0, y0, w, h, owner: Callable[[int, int], int], label: str, hatch_fn=None) -> None:
        """A model drawn as `layers` rows of 2 halves; owner(layer, half) gives the device colour."""
        for layer in range(layers):
            for half in range(2):
                dev = owner(layer, half)
                ax.add_patch(Rectangle((x0 + half * w / 2, y0 + (layers - 1 - layer) * h / layers), w / 2, h / layers,
                                       facecolor=colors[dev % len(colors)], edgecolor="white", lw=1.5,
                                       hatch=hatch_fn(layer, half) if hatch_fn else None))
        ax.text(x0 + w / 2, y0 - 0.06, label, ha="center", va="top", fontsize=9)

    def frame(ax, title: str, note: str) -> None:
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.25, 1.05)
        ax.axis("off")
        ax.set_title(title, fontsize=11)
        ax.text(0.5, -0.22, note, ha="center", va="bottom", fontsize=8.5, wrap=True)

    ax = axes[0]
    for d in range(2):
        model(ax, 0.08 + d * 0.46, 0.12, 0.38, 0.8, lambda l, h, d=d: d, f"device {d}: full copy\nbatch shard {d}")
    frame(ax, "Data parallel (DDP; ZeRO)", "same model everywhere, different data;\ngradients all_reduced. "
          "ZeRO: each device\nkeeps only 1/N of params/grads/optimizer")
    ax = axes[1]
    model(ax, 0.3, 0.12, 0.4, 0.8, lambda l, h: h, "each layer's matrices\nsplit in halves: dev 0 | dev 1")
    frame(ax, "Tensor (model) parallel", "every layer split across devices;\nactivations all_reduced "
          "inside each layer")
    ax = axes[2]
    model(ax, 0.3, 0.12, 0.4, 0.8, lambda l, h: l // 2, "layers 0-1: dev 0\nlayers 2-3: dev 1")
    frame(ax, "Pipeline parallel", "consecutive layers on different devices;\nmicro-batches flow "
          "stage to stage (send/recv)")
    ax = axes[3]
    for d in range(2):
        model(ax, 0.08 + d * 0.46, 0.12, 0.38, 0.8, lambda l, h, d=d: 4 * d + 2 * (l // 2) + h,
              f"replica {d}: 4 devices\n(2 stages × 2 tensor)")
    frame(ax, "3D = data × pipeline × tensor", "here 2 × 2 × 2 = 8 devices (colours);\nDeepSpeed: ZeRO-1 "
          "data parallel + pipeline\n+ Megatron-style tensor parallel")
    fig.tight_layout()
    return fig


def plot_all_reduce_times(rows: list[AllReduceTime], world_size: int, backend: str):
    """all_reduce time and algorithm bandwidth against message size (log-log)."""
    import matplotlib.pyplot as plt

    sizes = [r.bytes for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.loglog(sizes, [1e3 * r.seconds for r in rows], "o-")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("all_reduce time (ms, median)")
    a.set_title(f"all_reduce on {world_size} ranks ({backend})")
    b.semilogx(sizes, [r.gbytes_per_s for r in rows], "o-", color="C1")
    b.set_xlabel("message size (bytes)")
    b.set_ylabel("size / time (GB/s)")
    b.set_title("small messages: latency-bound; large: bandwidth-bound")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
