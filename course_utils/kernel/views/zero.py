"""Notebook 03's tables and figures: the ZeRO keys of the course configs, measured bytes per rank
against the formulas, stage 3's partitions, parameters read whole (exercise 2), and the DeepSpeed source
lines the notebook cites."""
from __future__ import annotations

from pathlib import Path

from course_utils.kernel import configs
from course_utils.common.record import read_as
from course_utils.common.records.zero import Comms, GradPeak, Ownership, Partition, WholeRead, ZeroMemory
from course_utils.common.zero_rules import BYTES_PER_PARAM, deepspeed_expected, edge_grad_numel, zero_formula
from course_utils.kernel.views.source import show_source


# What the stage 2/3 keys of configs/zero2.json and configs/zero3.json do (DeepSpeed 0.19 semantics).
ZERO_KEYS = {
    "overlap_comm": "reduce one bucket on a side stream while backward fills another (a second bucket buffer); "
                    "stage 2 reduces during backward without it too (partition_gradients), stage 1 only with it",
    "contiguous_gradients": "copy each reduced gradient into one pre-allocated partition buffer "
                            "(grads_in_partition): no fragmentation, one flat tensor for the step",
    "reduce_scatter": "stage 1/2: reduce the gradients bucket by bucket, each slice for its owner (true: "
                      "all-reduce per bucket, or dist.reduce with use_multi_rank_bucket_allreduce false; "
                      "false: one all-reduce of everything); stage 3: a real reduce-scatter",
    "reduce_bucket_size": "elements per gradient bucket: bigger = fewer, larger collectives, more memory",
    "allgather_partitions": "read by nothing in DeepSpeed 0.19.8 (stages 1/2 always all-gather the "
                            "updated partitions)",
    "allgather_bucket_size": "stage 1/2: elements per all-gather of updated parameters, only where torch "
                             "lacks all_gather_into_tensor (otherwise one all-gather per group); must be even (asserted)",
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


def zero_memory_rows(records: list[dict], param_numels: list[int]) -> list[dict]:
    """One row per rank and run from a launch's ``zero_memory`` records (every rank): measured
    model-state bytes, the paper's formula and the formula with DeepSpeed's documented adjustments.

    ``param_numels`` are the model's parameter sizes in ``model.parameters()`` order: the stage 1–2 gradient
    term (whole parameters on a partition's edge) is computed from them by DeepSpeed's partitioning rules
    (:func:`edge_grad_numel`), not read from the engine, so the measured buffer can disagree with it."""
    rows = []
    for r in read_as(records, ZeroMemory, rank=None):
        psi, stage, n, dtype = r.num_params, r.stage, r.world_size, r.dtype
        edge = edge_grad_numel(param_numels, n, r.rank, BYTES_PER_PARAM[dtype]["grads"]) if stage in (1, 2) else None
        expected = deepspeed_expected(psi, stage, n, dtype, edge, r.persistent_numel)
        m = r.measured
        rows.append({"stage": stage, "world_size": n, "dtype": dtype, "rank": r.rank, "offload": r.offload,
                     "predicted_grads": expected["grads"],
                     "params": m["params"], "grads": m["grads"], "optimizer": m["optimizer"],
                     "buffers": m["buffers"], "measured_bytes": m["model_states"],
                     "formula_bytes": zero_formula(psi, stage, n, dtype)["total"],
                     "adjusted_bytes": expected["total"],
                     "accelerator_bytes": r.accelerator["allocated"], "accelerator_peak": r.accelerator["peak"]})
    for row in rows:
        row["vs_formula"] = row["measured_bytes"] / row["formula_bytes"] - 1
        row["vs_adjusted"] = row["measured_bytes"] / row["adjusted_bytes"] - 1
    return sorted(rows, key=lambda r: (r["world_size"], r["dtype"], r["stage"], r["offload"], r["rank"]))


def partition_table(records: list[dict]):
    """Stage 3's partitions of one weight, one row per rank (the ``partition`` records of
    ``--show_partitions``): the shard ``zero.Init`` left on the rank, the whole weight inside
    ``GatheredParameters``, and after it."""
    import pandas as pd

    return pd.DataFrame(read_as(records, Partition, rank=None)).set_index("rank")


WHOLE_READERS = {(0, "plain"): "stage 0, plain read", (3, "plain"): "stage 3, plain read", (3, "yours"): "stage 3, yours"}


def whole_read_table(records: list[dict], rank: int = 0):
    """Exercise 2's reads on rank ``rank``: each parameter's shape and norm as stage 0 read it, as the same plain
    read finds it at stage 3, and as the learner's ``read_whole`` returned it. Norms to one decimal only: the
    table shows what the reads found, the check compares them at full precision."""
    import pandas as pd

    rows = []
    for r in read_as(records, WholeRead, rank=None):
        if r.rank == rank:
            for name, (shape, norm) in r.reads.items():
                rows.append({"read": WHOLE_READERS[(r.stage, r.reader)], "parameter": name, "shape": tuple(shape),
                             "norm": round(float(norm), 1)})
    return pd.DataFrame(rows).set_index(["read", "parameter"])


def whole_read_mismatches(records: list[dict], world_size: int, rel: float = 1e-4) -> list[str]:
    """Where the learner's stage-3 reads (every rank's) differ from rank 0's plain read at stage 0 (the whole
    tensors after the same two steps): a missing rank or parameter, a shape, or a norm off by more than ``rel``
    (stage 0 and stage 3 reduce the gradients differently, so the norms agree to about 1e-7, not bit for bit)."""
    reads = read_as(records, WholeRead, rank=None)
    reference = next(r.reads for r in reads if (r.stage, r.reader, r.rank) == (0, "plain", 0))
    yours = {r.rank: r.reads for r in reads if r.reader == "yours"}
    wrong = [f"rank {k}: no answer" for k in range(world_size) if k not in yours]
    for k, got in sorted(yours.items()):
        for name, (shape, norm) in reference.items():
            answer = got.get(name)
            if not (isinstance(answer, (list, tuple)) and len(answer) == 2):
                wrong.append(f"rank {k}, {name}: not a (shape, norm) pair")
            elif list(answer[0]) != list(shape):
                wrong.append(f"rank {k}, {name}: shape")
            elif not isinstance(answer[1], (int, float)) or abs(answer[1] - norm) > rel * norm:
                wrong.append(f"rank {k}, {name}: norm")
    return wrong


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
    show_source("deepspeed", relpath, pattern, after=after, limit=limit)


# ---------------------------------------------------------------- communication per step

# Bytes each rank sends per collective, as a multiple of the logged message (ring algorithms, N ranks):
# an all_reduce sends 2(N-1)/N of its buffer, an all_gather_into_tensor (N-1) times its input shard,
# a reduce_scatter_tensor (N-1)/N of its input.
RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather_into_tensor": lambda n: n - 1,
               "reduce_scatter_tensor": lambda n: (n - 1) / n}
PAPER_VOLUME = {0: 2, 1: 2, 2: 2, 3: 3}     # the ZeRO paper's per-rank volume per step for large N, in units of Ψ
SCALAR_BYTES = 64                           # messages this small are flags and norms, not model data


def comm_rows(records: list[dict]) -> list[dict]:
    """One row per (world size, dtype, run, collective) of rank 0's comms-logger messages during one
    training step: messages, bytes logged (≥ 64 B), and what a ring algorithm sends per rank, in Ψ."""
    rows = []
    for c in read_as(records, Comms):
        elem = 4 if c.dtype == "fp32" else 2
        for op, sizes in sorted(c.messages.items()):
            data = {int(b): n for b, n in sizes.items() if int(b) > SCALAR_BYTES}
            logged = sum(b * n for b, n in data.items())
            sent = logged * RING_FACTOR[op](c.world_size) if op in RING_FACTOR else 0.0
            rows.append({"world_size": c.world_size, "dtype": c.dtype, "run": c.label, "stage": c.stage,
                         "collective": op, "messages": sum(sizes.values()), "data messages": sum(data.values()),
                         "logged_bytes": logged, "sent_per_rank_psi": sent / (c.num_params * elem),
                         "num_params": c.num_params, "owned_numel": c.owned_numel})
    return rows


def comm_volume_table(rows: list[dict]):
    """Per run: what each rank sends per step in units of Ψ (elements × element size), by collective, next to the
    paper's figure at the run's N ranks: its 2Ψ / 2Ψ / 2Ψ / 3Ψ are the large-N limits of ring collectives that send
    (N−1)/N of them, so on N ranks the paper's own count is (N−1)/N × those, and ``measured ÷ paper`` compares like with like."""
    import pandas as pd

    data = pd.DataFrame([r for r in rows if r["collective"] in RING_FACTOR])     # not the metadata broadcasts
    table = (data.pivot_table(index=["world_size", "dtype", "run"], columns="collective",
                                            values="sent_per_rank_psi", aggfunc="sum", fill_value=0.0))
    table["sent per rank (Ψ)"] = table.sum(axis=1)
    stages = {(r["world_size"], r["dtype"], r["run"]): r["stage"] for r in rows}
    table["paper at this N (Ψ)"] = [PAPER_VOLUME[stages[k]] * (k[0] - 1) / k[0] for k in table.index]
    table["measured ÷ paper"] = table["sent per rank (Ψ)"] / table["paper at this N (Ψ)"]
    return table.round(3)


# measured ÷ paper as section 4 of notebook 03 reads it, per run: stages 1-2 all-reduce where the paper reduce-scatters,
# stage 3 gathers once while its parameters stay gathered, and a little more than the paper once they are released
VS_PAPER = {"stage 0": (1.0, 1.0), "stage 1": (1.5, 1.5), "stage 2": (1.5, 1.5), "stage 3": (2 / 3, 2 / 3),
            "stage 3, released after use": (1.0, 1.25)}


def vs_paper_problems(table) -> dict:
    """The runs of :func:`comm_volume_table` whose ``measured ÷ paper`` leaves :data:`VS_PAPER` (equal within the
    table's rounding, or inside the open range): (world size, dtype, run) → the ratio."""
    off = {}
    for key, ratio in table["measured ÷ paper"].items():
        low, high = VS_PAPER[key[2]]
        if not (abs(ratio - low) <= 0.001 if low == high else low < ratio < high):
            off[key] = float(ratio)
    return off


GRAD_HOLDERS = ("param.grad", "grads_in_partition", "all_grad_tensors")   # where a peak's gradient bytes are held


def grad_peak_table(records: list[dict]):
    """The gradient bytes of stages 1 and 2 during backward (``--grad_peaks``), in multiples of Ψ × 4 bytes, with
    the peak split by where DeepSpeed holds it: whole ``param.grad`` tensors not reduced yet, the partition buffer
    of this backward (``grads_in_partition``), the sum of the earlier micro-steps (``all_grad_tensors``)."""
    import pandas as pd

    rows = [{"world_size": g.world_size, "stage": g.stage, "gradient_accumulation_steps": g.gas,
             "peak during backward (Ψ)": g.peak_grad_bytes / (4 * g.num_params),
             **{f"… in {h}": g.peak_held_in.get(h, 0) / (4 * g.num_params) for h in GRAD_HOLDERS},
             "its partition (Ψ)": g.partition_numel / g.num_params,
             "held between micro-steps (Ψ)": g.between_micro_steps / (4 * g.num_params) if g.gas > 1 else None,
             "buckets at most (MB)": g.peak_bucket_bytes / 1e6}
            for g in read_as(records, GradPeak)]
    return pd.DataFrame(rows).set_index(["world_size", "stage", "gradient_accumulation_steps"]).round(3)


def grad_peak_comparison(records: list[dict]) -> list[str]:
    """One line per gradient_accumulation_steps: stage 2's peak against stage 1's and, with accumulation, what each
    holds between micro-steps (multiples of Ψ × 4 bytes), so the text can say which is larger on these ranks."""
    peak = {(g.stage, g.gas): g for g in read_as(records, GradPeak)}
    lines = []
    for gas in sorted({g for _, g in peak}):
        s1, s2 = peak[(1, gas)], peak[(2, gas)]
        psi4 = 4 * s2.num_params
        line = (f"{s2.world_size} ranks, gradient_accumulation_steps {gas}: stage 2 peaks at {s2.peak_grad_bytes / psi4:.3f}Ψ, "
                f"{'below' if s2.peak_grad_bytes < s1.peak_grad_bytes else 'above'} stage 1's {s1.peak_grad_bytes / psi4:.3f}Ψ")
        if gas > 1:
            line += (f"; between micro-steps stage 2 holds {s2.between_micro_steps / psi4:.3f}Ψ, "
                     f"stage 1 {s1.between_micro_steps / psi4:.3f}Ψ")
        lines.append(line)
    return lines


def stage2_peak_matches_the_code(peak: GradPeak, waiting_numel: int) -> bool:
    """Whether a stage-2 peak is what section 3 reads in DeepSpeed: whole ``param.grad`` bytes of exactly the one
    gradient larger than the bucket (``waiting_numel`` fp32 elements, give or take a scalar), and partition buffers
    (this backward's, and the earlier micro-steps' sum) of at most one partition each."""
    held = peak.peak_held_in
    return (abs(held.get("param.grad", 0) - 4 * waiting_numel) <= 4096
            and max(held.get("grads_in_partition", 0), held.get("all_grad_tensors", 0)) <= 4 * peak.partition_numel)


def plot_ownership(records: list[dict], stages=(0, 1, 2, 3), first: int | None = None):
    """Which elements of the model each rank owns at each stage, from the ranks' own ``ownership``
    records: one row per (stage, rank), the flattened model along x in DeepSpeed's order, a rank's
    slices in its colour, parameter edges as thin lines. ``first`` zooms onto the first parameters."""
    import matplotlib.pyplot as plt

    owned = read_as(records, Ownership, rank=None)
    world = max(o.world_size for o in owned)
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(len(stages), 1, figsize=(12, 0.55 * world * len(stages) + 0.8), squeeze=False)
    for ax, stage in zip(axes[:, 0], stages):
        mine = sorted((o for o in owned if o.stage == stage), key=lambda o: o.rank)
        params = mine[0].params[:first] if first else mine[0].params
        start_of, offset = {}, 0
        for name, numel in params:
            start_of[name] = offset
            offset += numel
        for o in mine:
            bars = [(start_of[n] + a, b - a) for n, a, b in o.slices if n in start_of]
            ax.broken_barh(bars, (o.rank - 0.4, 0.8), color=colors(o.rank))
        for x in start_of.values():
            ax.axvline(x, color="grey", lw=0.3)
        ax.set_xlim(0, offset)
        ax.set_yticks(range(world), [f"rank {r}" for r in range(world)])
        ax.set_ylabel(f"stage {stage}", rotation=0, ha="right", va="center")
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("element of the flattened model (parameter edges in grey)")
    fig.tight_layout()
    return fig


def find_in_deepspeed(pattern: str) -> list[str]:
    """Every line of the installed DeepSpeed that contains ``pattern``, as ``file:line: text``."""
    import deepspeed

    root = Path(deepspeed.__file__).parent
    return [f"deepspeed/{f.relative_to(root)}:{i + 1}: {line.strip()}"
            for f in sorted(root.rglob("*.py")) for i, line in enumerate(f.read_text().splitlines())
            if pattern in line]
