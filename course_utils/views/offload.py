"""Notebook 04's rows, tables and figure: the offload ladder as measured (the ``rung`` records of
scripts/04_offload_ladder.py: every state by the DeepSpeed structure and device holding it) and as the
formula and :mod:`course_utils.rank.zero_rules` predict it."""
from __future__ import annotations

from dataclasses import asdict

from .. import scripts
from ..rank.engine import LADDER
from ..rank.record import read_as
from ..rank.zero_rules import STATES as MODEL_STATES, placement, predicted_device_bytes


def ladder_rows(records: list[dict], rank: int = 0) -> list[dict]:
    """The ``rung`` records of one rank, in launch order, as plain rows (one dict per rung)."""
    return [asdict(r) for r in read_as(records, scripts.load("04_offload_ladder").Rung, rank)]


def ladder_prediction(num_params: int, world_size: int, dtype: str) -> dict[str, float]:
    """Accelerator bytes of model states per rung of :data:`LADDER` by the formula, with what each
    rung's offload options move to the host taken off (:func:`zero_rules.predicted_device_bytes`)."""
    return {name: predicted_device_bytes(num_params, stage, world_size, dtype, zero)
            for name, (stage, zero) in LADDER.items()}


def by_state_and_device(row: dict) -> dict[str, dict[str, int]]:
    """One rung's measured model-state bytes: {state: {device type: bytes}} (from ``row["held"]``)."""
    out: dict[str, dict[str, int]] = {s: {} for s in MODEL_STATES}
    for h in row["held"]:
        if h["state"] in out:
            out[h["state"]][h["device"]] = out[h["state"]].get(h["device"], 0) + h["bytes"]
    return out


def host_side_states(row: dict) -> list[str]:
    """The model states one rung holds in the structures of an optimizer step that runs on the host:
    ``optimizer`` when Adam's moments are in a ``DeepSpeedCPUAdam``'s ``state`` (its C++ kernel works on
    host memory only), ``grads`` when the gradient partition is the ``.grad`` of the optimizer's fp32
    partition (the buffer the host-side step reads) rather than the module's ``param.grad`` or the
    engine's own gradient buffers. Read from the structures, so it holds on a CPU-only machine too."""
    found = set()
    for h in row["held"]:
        if h["state"] == "optimizer" and h["structure"].startswith("DeepSpeedCPUAdam.state"):
            found.add("optimizer")
        if h["state"] == "grads" and h["structure"].endswith(".grad") and not h["structure"].startswith("module"):
            found.add("grads")
    return sorted(found)


def placement_comparison(rows: list[dict]):
    """Per rung and model state: where :mod:`zero_rules` says the config puts it (``predicted``), the
    bytes measured on the accelerator's device type and on the host apart from it (MiB), and whether
    the state sits in the structures of a host-side optimizer step (:func:`host_side_states`; None for the
    parameters, whose stage-3 shards are ``ds_tensor`` wherever they live)."""
    import pandas as pd

    out = []
    for r in rows:
        zero = LADDER[r["name"]][1]
        measured = by_state_and_device(r)
        predicted = placement({s: 1 for s in MODEL_STATES}, zero)
        host_side = host_side_states(r)
        for s in MODEL_STATES:
            on = measured[s].get(r["accelerator"], 0)
            out.append({"rung": r["name"], "state": s, "predicted": "host" if predicted[s]["host"] else "accelerator",
                        f"measured on {r['accelerator']} (MiB)": on / 2**20,
                        "measured on host apart from it (MiB)": (sum(measured[s].values()) - on) / 2**20,
                        "in host-side optimizer structures": s in host_side if s != "params" else None})
    return pd.DataFrame(out).set_index(["rung", "state"]).round(2)


def held_table(rows: list[dict], min_bytes: int = 64 * 1024):
    """Every rung's states by the structure holding them: MiB per device type (columns); structures
    holding less than ``min_bytes`` (scalars such as ``_global_grad_norm``) are left out."""
    import pandas as pd

    flat = [{"rung": r["name"], **h} for r in rows for h in r["held"] if h["bytes"] >= min_bytes]
    table = pd.DataFrame(flat).pivot_table(index=["rung", "state", "structure"], columns="device", values="bytes",
                                           aggfunc="sum", sort=False) / 2**20
    return table.round(2).fillna(0)


def plot_ladder(rows: list[dict]):
    """Seconds per step, model-state bytes by state (solid: on the accelerator's device type, hatched:
    in host memory apart from it) and peak RSS along the ladder."""
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    x = range(len(rows))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 3.8))
    a.bar(x, [r["step_seconds"] for r in rows], color="#4C72B0")
    a.set_title("seconds per step (median)")
    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}
    bottom = [0.0] * len(rows)
    split = rows[0]["accelerator"] != "cpu"        # a CPU-only machine has no host memory apart from the "accelerator"
    for state, color in colors.items():
        for where in ("accelerator", "host") if split else ("accelerator",):
            vals = []
            for r in rows:
                devices = by_state_and_device(r)[state]
                on = devices.get(r["accelerator"], 0)
                vals.append((on if where == "accelerator" else sum(devices.values()) - on) / 2**20)
            b.bar(x, vals, bottom=bottom, color=color, hatch="///" if where == "host" else None, edgecolor="white",
                  label=f"{state}" + (" (host)" if where == "host" else ""))
            bottom = [p + v for p, v in zip(bottom, vals)]
    b.set_title(f"model states per rank (MiB): on {rows[0]['accelerator']}" + (", host hatched" if split else ""),
                fontsize=9)
    b.legend(fontsize=7)
    c.bar(x, [r["peak_rss"] / 2**20 for r in rows], color="#55A868")
    c.set_title("peak RSS per rank (MiB)")
    for ax in (a, b, c):
        ax.set_xticks(list(x), names, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    return fig
