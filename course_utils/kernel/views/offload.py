"""Notebook 04's rows, tables and figure: the offload ladder as measured (the ``rung`` records of
scripts/04_offload_ladder.py: every state by the DeepSpeed structure and device holding it) and as the
formula and :mod:`course_utils.common.zero_rules` predict it."""
from __future__ import annotations

from dataclasses import asdict

from course_utils.common.record import read_as
from course_utils.common.records.offload import Rung
from course_utils.common.zero_rules import LADDER
from course_utils.common.zero_rules import STATES as MODEL_STATES, placement, predicted_device_bytes


def ladder_rows(records: list[dict], rank: int = 0) -> list[Rung]:
    """The ``rung`` records of one rank, in launch order (their ``held`` rows are :class:`Holding`)."""
    return read_as(records, Rung, rank)


def ladder_prediction(num_params: int, world_size: int, dtype: str) -> dict[str, float]:
    """Accelerator bytes of model states per rung of :data:`LADDER` by the formula, with what each
    rung's offload options move to the host taken off (:func:`zero_rules.predicted_device_bytes`)."""
    return {name: predicted_device_bytes(num_params, stage, world_size, dtype, zero)
            for name, (stage, zero) in LADDER.items()}


SIDES = ("accelerator", "host")


def by_state_and_device(row: Rung) -> dict[str, dict[str, int]]:
    """One rung's measured model-state bytes: {state: {device type: bytes}} (from ``row.held``)."""
    return _by_state(row, "device")


def by_state_and_side(row: Rung) -> dict[str, dict[str, int]]:
    """One rung's measured model-state bytes: {state: {side DeepSpeed placed them on: bytes}}."""
    return _by_state(row, "side")


def buffer_bytes(row: Rung, side: str = "accelerator") -> int:
    """Bytes of the buffers DeepSpeed itself allocated (not model states, not the module's own buffers) that the walk
    found on ``side``, held after backward: stage 3's reduce bucket (``ipg_buckets``, ``reduce_bucket_size``
    elements kept for the whole run), the offload staging buffers, the NVMe swappers' page-locked buffers. Stages 1-2
    free their buckets when backward ends, so their rows hold none (notebook 05 measures them during backward)."""
    return sum(h.bytes for h in row.held if h.state == "buffers" and h.structure != "module buffer" and h.side == side)


def _by_state(row: Rung, key: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {s: {} for s in MODEL_STATES}
    for h in row.held:
        if h.state in out:
            where = getattr(h, key)
            out[h.state][where] = out[h.state].get(where, 0) + h.bytes
    return out


def ladder_table(rows: list[Rung]):
    """Per rung: seconds per step and its phases, the model states by where DeepSpeed put them, and DeepSpeed's own
    buffers held after backward (:func:`buffer_bytes`) by side (MiB)."""
    import pandas as pd

    MiB = 2**20
    return pd.DataFrame([{"rung": r.name, "s/step": r.step_seconds,
                          **{f"{k} (s)": v for k, v in (r.phases or {}).items()},
                          "model states, accelerator side (MiB)": r.accelerator_side_bytes / MiB,
                          "model states, host side (MiB)": r.host_side_bytes / MiB, "NVMe files (MiB)": r.nvme_bytes / MiB,
                          **{f"DeepSpeed buffers, {side} side (MiB)": buffer_bytes(r, side) / MiB for side in SIDES},
                          "optimizer": r.optimizer} for r in rows]).set_index("rung").round(3)


def placement_comparison(rows: list[Rung]):
    """Per rung and model state: where :mod:`zero_rules` says the config puts it (``predicted``) beside where
    DeepSpeed put it (MiB on each side, read from its structures: ``side`` of ``row.held``) and, where the
    accelerator is not the CPU, the MiB on the accelerator's own device type (the tensors' devices)."""
    import pandas as pd

    out = []
    for r in rows:
        predicted = placement({s: 1 for s in MODEL_STATES}, LADDER[r.name][1])
        sides, devices = by_state_and_side(r), by_state_and_device(r)
        for s in MODEL_STATES:
            row = {"rung": r.name, "state": s, "predicted": "host" if predicted[s]["host"] else "accelerator",
                   **{f"{side} side (MiB)": sides[s].get(side, 0) / 2**20 for side in SIDES}}
            if r.accelerator != "cpu":
                row[f"on {r.accelerator} tensors (MiB)"] = devices[s].get(r.accelerator, 0) / 2**20
            out.append(row)
    return pd.DataFrame(out).set_index(["rung", "state"]).round(2)


def held_table(rows: list[Rung], min_bytes: int = 64 * 1024):
    """Every rung's states by the structure holding them: MiB per side DeepSpeed placed them on and device
    type (columns); structures holding less than ``min_bytes`` (scalars such as ``_global_grad_norm``) are left out."""
    import pandas as pd

    flat = [{"rung": r.name, **asdict(h), "where": f"{h.side} side ({h.device})"} for r in rows for h in r.held
            if h.bytes >= min_bytes]
    table = pd.DataFrame(flat).pivot_table(index=["rung", "state", "structure"], columns="where", values="bytes",
                                           aggfunc="sum", sort=False) / 2**20
    return table.round(2).fillna(0)


def falls_along(rows: list[Rung]) -> list[tuple[str, str, str, bool]]:
    """Each offload rung against the rung it extends: the accelerator-side bytes of 2 + offload vs 2 and of
    3 + offload vs 3, the host-side bytes of NVMe vs 3 + offload; (rung, base, the bytes compared, whether
    they are lower on the rung)."""
    by_name = {r.name: r for r in rows}
    pairs = [("stage 2 + offload", "stage 2", "accelerator_side_bytes"),
             ("stage 3 + offload", "stage 3", "accelerator_side_bytes"),
             ("stage 3 + NVMe", "stage 3 + offload", "host_side_bytes")]
    return [(rung, base, key, getattr(by_name[rung], key) < getattr(by_name[base], key)) for rung, base, key in pairs
            if rung in by_name and base in by_name]


def plot_ladder(rows: list[Rung]):
    """Seconds per step split into its phases, and the bytes per rank after backward by where DeepSpeed put them
    along the ladder: model states on the accelerator side, DeepSpeed's own buffers there (:func:`buffer_bytes`),
    model states on the host side and in NVMe files."""
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    x = range(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 3.8))
    bottom = [0.0] * len(rows)
    for phase, color in (("forward + backward", "#4C72B0"), ("engine.step()", "#DD8452")):
        vals = [(r.phases or {}).get(phase, 0.0) for r in rows]
        a.bar(x, vals, bottom=bottom, color=color, label=phase)
        bottom = [p + v for p, v in zip(bottom, vals)]
    a.set_title("seconds per step (median), by phase")
    a.legend(fontsize=7)
    bottom = [0.0] * len(rows)
    layers = (("model states, accelerator side", lambda r: r.accelerator_side_bytes, dict(color="#4C72B0")),
              ("DeepSpeed buffers, accelerator side", buffer_bytes, dict(color="#C44E52", hatch="xx")),
              ("model states, host side", lambda r: r.host_side_bytes, dict(color="#55A868", hatch="///")),
              ("model states, NVMe files", lambda r: r.nvme_bytes, dict(color="#8172B2", hatch="...")))
    for label, measured, style in layers:
        vals = [measured(r) / 2**20 for r in rows]
        b.bar(x, vals, bottom=bottom, edgecolor="white", label=label, **style)
        bottom = [p + v for p, v in zip(bottom, vals)]
    b.set_title("per rank after backward (MiB), by where DeepSpeed put it", fontsize=9)
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.set_xticks(list(x), names, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    return fig
