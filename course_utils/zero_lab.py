"""The course model and the ZeRO experiments that notebooks 03 and 04 launch.

One GPT-2 built from a config (no download), random tokens as data, and small helpers the rank
scripts share: a config for a given stage/dtype/offload, one training step, and a measurement of
what the engine holds at the moment model states peak (after backward, before the optimizer step).
"""
from __future__ import annotations

import gc
import os
import time
from typing import Any

from . import configs, models

# ~13.8 M parameters: big enough that model states dwarf everything else, small enough for 2 CPU cores
MODEL = {"vocab_size": 8192, "n_positions": 128, "n_embd": 384, "n_layer": 6, "n_head": 6}
SEQ_LEN = 32


def build_model(seed: int = 0, **overrides: Any):
    """The course GPT-2 (``GPT2LMHeadModel``) from a ``GPT2Config``: same seed, same weights on every rank."""
    special = MODEL["vocab_size"] - 1      # GPT-2's default token ids (50256) lie outside the small vocabulary
    return models.tiny_gpt2(**{**MODEL, **overrides}, seed=seed, dropout=0.0, special_token_id=special)


num_params = models.count_parameters    # Ψ, as the notebooks call it


def ds_config(stage: int, dtype: str = "bf16", micro_batch: int = 1, **zero: Any) -> dict:
    """The course config ``configs/zero<stage>.json`` for ``dtype`` ("fp32" | "bf16" | "fp16") with a
    small micro-batch; extra keyword arguments go into ``zero_optimization``."""
    cfg, _ = configs.load(f"zero{stage}.json")
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["zero_optimization"].update(zero)
    for key in ("bf16", "fp16"):
        cfg.pop(key, None)
    if dtype in ("bf16", "fp16"):
        cfg[dtype] = {"enabled": True}
    return cfg


def batch(engine, seed: int = 0):
    """Random token ids for one micro-batch on the engine's device (labels = inputs: next-token loss)."""
    import torch

    g = torch.Generator().manual_seed(seed + engine.global_rank)
    vocab = engine.module.config.vocab_size
    ids = torch.randint(0, vocab, (engine.train_micro_batch_size_per_gpu(), SEQ_LEN), generator=g)
    return ids.to(engine.device)


def forward_backward(engine, step: int = 0) -> float:
    ids = batch(engine, step)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    return float(loss.detach())


def accelerator_bytes() -> dict[str, int]:
    """Allocated / peak bytes on the accelerator (0 on a CPU-only machine)."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return {"allocated": 0, "peak": 0}
    return {"allocated": int(acc.memory_allocated()), "peak": int(acc.max_memory_allocated())}


def release(engine) -> None:
    """Drop an engine and everything it holds before the next one is built in the same process."""
    from deepspeed.accelerator import get_accelerator

    import ctypes

    engine.destroy()
    gc.collect()
    get_accelerator().empty_cache()
    ctypes.CDLL("libc.so.6").malloc_trim(0)     # hand freed heap pages back, so the next RSS starts clean


# ---------------------------------------------------------------- notebook 03: rows, table, plot

# What the stage 2/3 keys of configs/zero2.json and configs/zero3.json do (DeepSpeed 0.19 semantics).
ZERO_KEYS = {
    "overlap_comm": "reduce gradient buckets while backward still runs (needs extra bucket buffers)",
    "contiguous_gradients": "copy each reduced gradient into one pre-allocated partition buffer "
                            "(grads_in_partition): no fragmentation, one flat tensor for the step",
    "reduce_scatter": "stage 2: reduce buckets with reduce-scatter (each rank gets its slice) "
                      "instead of all-reduce",
    "reduce_bucket_size": "elements per gradient bucket: bigger = fewer, larger collectives, more memory",
    "allgather_partitions": "stage 1/2: after the step, all-gather the updated parameter partitions "
                            "(else a broadcast per partition)",
    "allgather_bucket_size": "stage 1/2: elements per all-gather of updated parameters",
    "sub_group_size": "stage 3: the optimizer steps over groups of this many elements at a time "
                      "(the unit swapped in and out with NVMe offload)",
    "stage3_prefetch_bucket_size": "stage 3: elements gathered ahead of use during forward/backward",
    "stage3_param_persistence_threshold": "stage 3: parameters this small are never partitioned",
    "stage3_max_live_parameters": "stage 3: upper bound of gathered (full) parameters kept alive",
    "stage3_max_reuse_distance": "stage 3: keep a gathered parameter if it is needed again within this "
                                 "many parameters",
    "stage3_gather_16bit_weights_on_model_save": "stage 3: gather the full 16-bit weights when saving",
}


def config_keys_table(*names: str):
    """The zero_optimization keys of course configs side by side, with what each one does."""
    import pandas as pd

    zero = {n: configs.load(n)[0]["zero_optimization"] for n in names}
    keys = sorted({k for z in zero.values() for k in z} - {"stage"}, key=lambda k: list(ZERO_KEYS).index(k)
                  if k in ZERO_KEYS else len(ZERO_KEYS))
    rows = [{"key": k, **{n: zero[n].get(k, "—") for n in names}, "what it does": ZERO_KEYS.get(k, "")}
            for k in keys]
    return pd.DataFrame(rows).set_index("key")


def zero_memory_rows(records: list[dict]) -> list[dict]:
    """One row per rank and run from the script's ``zero_memory`` records: measured model-state
    bytes, the paper's formula and the formula with DeepSpeed's documented adjustments."""
    from .memory import deepspeed_expected, zero_formula

    rows = []
    for r in records:
        psi, stage, n, dtype = r["num_params"], r["stage"], r["world_size"], r["dtype"]
        expected = deepspeed_expected(psi, stage, n, dtype, r["grad_partition_numel"] or None, r["persistent_numel"])
        m = r["measured"]
        rows.append({"stage": stage, "world_size": n, "dtype": dtype, "rank": r["rank"],
                     "params": m["params"], "grads": m["grads"], "optimizer": m["optimizer"],
                     "buffers": m["buffers"], "measured_bytes": m["model_states"],
                     "formula_bytes": zero_formula(psi, stage, n, dtype)["total"],
                     "adjusted_bytes": expected["total"],
                     "accelerator_bytes": r["accelerator"]["allocated"]})
    for row in rows:
        row["vs_formula"] = row["measured_bytes"] / row["formula_bytes"] - 1
        row["vs_adjusted"] = row["measured_bytes"] / row["adjusted_bytes"] - 1
    return sorted(rows, key=lambda r: (r["world_size"], r["dtype"], r["stage"], r["rank"]))


def plot_zero_memory(rows: list[dict], rank: int = 0):
    """Stacked bars of rank ``rank``'s params / grads / optimizer bytes per stage, one panel per
    (world size, dtype), with the paper's formula as a black tick."""
    import matplotlib.pyplot as plt

    panels = sorted({(r["world_size"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4), sharey=True, squeeze=False)
    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}
    for ax, (n, dtype) in zip(axes[0], panels):
        sel = [r for r in rows if r["world_size"] == n and r["dtype"] == dtype and r["rank"] == rank]
        bottom = [0.0] * len(sel)
        for cat, color in colors.items():
            vals = [r[cat] / 2**20 for r in sel]
            ax.bar([r["stage"] for r in sel], vals, bottom=bottom, color=color, label=cat)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.scatter([r["stage"] for r in sel], [r["formula_bytes"] / 2**20 for r in sel], marker="_", s=600,
                   color="black", label="paper formula", zorder=3)
        ax.set_title(f"{n} ranks, {dtype}")
        ax.set_xlabel("ZeRO stage")
        ax.set_xticks(range(4))
    axes[0][0].set_ylabel(f"MiB on rank {rank}")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def show_deepspeed_source(relpath: str, pattern: str, after: int = 2, limit: int = 2) -> None:
    """Print the lines of the installed DeepSpeed file ``relpath`` that contain ``pattern`` (plus
    ``after`` lines each), with line numbers: the evidence for what the notebook says DeepSpeed does."""
    import deepspeed
    from pathlib import Path

    path = Path(deepspeed.__file__).parent / relpath
    lines = path.read_text().splitlines()
    hits = [i for i, line in enumerate(lines) if pattern in line][:limit]
    if not hits:
        raise LookupError(f"{pattern!r} not found in {path}: the installed DeepSpeed differs from 0.19.")
    for i in hits:
        print(f"deepspeed/{relpath}:{i + 1}")
        for j in range(i, min(i + 1 + after, len(lines))):
            print(f"  {j + 1:5d} | {lines[j]}")


# ---------------------------------------------------------------- notebook 04: offload ladder

# The documented order (fastest / most accelerator memory first) and what each rung adds.
LADDER = {
    "stage 0": (0, {}),
    "stage 1": (1, {}),
    "stage 2": (2, {}),
    "stage 2 + offload": (2, {"offload_optimizer": {"device": "cpu"}}),
    "stage 3": (3, {}),
    "stage 3 + offload": (3, {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}),
}


def nvme_offload(folder: str) -> dict:
    """zero_optimization keys for ZeRO-Infinity: optimizer states and parameters swapped to ``folder``."""
    return {"offload_optimizer": {"device": "nvme", "nvme_path": folder, "pin_memory": False, "buffer_count": 4},
            "offload_param": {"device": "nvme", "nvme_path": folder, "pin_memory": False, "buffer_count": 5,
                              "buffer_size": 1e8}}


def reset_peak_rss() -> None:
    """Reset this process's peak resident set (Linux: writing 5 to /proc/self/clear_refs resets VmHWM)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key} line: RSS measurements need Linux.")


def peak_rss_bytes() -> int:
    """Peak resident set size since the last :func:`reset_peak_rss` (VmHWM)."""
    return _status_bytes("VmHWM")


def current_rss_bytes() -> int:
    """Resident set size now (VmRSS)."""
    return _status_bytes("VmRSS")


def placement_bytes(inventory, zero: dict, accelerator: str) -> dict[str, int]:
    """Model-state bytes on the accelerator vs in host memory.

    On a GPU the tensors' devices say it. On a CPU machine both places are the same RAM, so the split
    follows where DeepSpeed was *told* to put each state: ``offload_optimizer`` sends optimizer states
    (and their fp32 gradient partition) to the host, ``offload_param`` the parameters.
    """
    from .memory import model_state_bytes

    if accelerator != "cpu":
        dev = model_state_bytes(inventory, device=accelerator)["model_states"]
        return {"device_bytes": dev, "host_bytes": model_state_bytes(inventory, device="cpu")["model_states"]}
    states = model_state_bytes(inventory)
    offloaded = {"optimizer"} if "offload_optimizer" in zero else set()
    if "offload_param" in zero:
        offloaded.add("params")
    if "offload_optimizer" in zero:
        offloaded.add("grads")       # the reduced gradient partition is copied to the host for the CPU step
    host = sum(states[c] for c in offloaded)
    return {"device_bytes": states["model_states"] - host, "host_bytes": host}


def gathered_numel(module) -> int:
    """Stage 3: elements of the parameters currently gathered whole (not counting persistent ones)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(p.ds_numel for p in module.parameters()
               if getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE and not getattr(p, "ds_persist", False))


def ladder_rows(records: list[dict], rank: int = 0) -> list[dict]:
    """The ``rung`` records of one rank, in launch order, as the rows notebook 04 records."""
    return [{"name": r["value"]["name"], "step_seconds": r["value"]["step_seconds"],
             "device_bytes": r["value"]["device_bytes"], "host_bytes": r["value"]["host_bytes"],
             "peak_rss": r["value"]["peak_rss"], "rss_start": r["value"]["rss_start"], "gathered_in_forward": r["value"]["gathered_in_forward"],
             "persistent_numel": r["value"]["persistent_numel"],
             "optimizer": r["value"]["optimizer"]}
            for r in records if r["name"] == "rung" and r["rank"] == rank]


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


def training_dtype() -> str:
    """bf16 on an accelerator that supports it; fp32 on a CPU, where bf16 matrix products are emulated
    (many times slower) unless the processor has AVX512-BF16 or AMX instructions."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    return "bf16" if acc.device_name() != "cpu" and acc.is_bf16_supported() else "fp32"


def predicted_device_bytes(num_params: int, world_size: int, dtype: str) -> dict[str, float]:
    """Accelerator bytes of model states per rung of :data:`LADDER`, from the (DeepSpeed-adjusted)
    formula: what ``offload_optimizer`` / ``offload_param`` move off the accelerator is subtracted."""
    from .memory import deepspeed_expected

    out = {}
    for name, (stage, zero) in LADDER.items():
        states = deepspeed_expected(num_params, stage, world_size, dtype)
        moved = ({"optimizer", "grads"} if "offload_optimizer" in zero else set()) | (
            {"params"} if "offload_param" in zero else set())
        out[name] = sum(states[c] for c in ("params", "grads", "optimizer") if c not in moved)
    return out
