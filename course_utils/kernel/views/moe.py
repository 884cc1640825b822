"""Notebook 15's tables: the ranks' MoE records (``scripts/15_moe.py``, ``scripts/15_moe_zero3.py``) against the
formulas the notebook states, computed here from the layout's sizes, never from the figure they are compared with."""
from __future__ import annotations

import math
import re

from course_utils.common.record import read_as
from course_utils.common.records.moe import Balance, CheckpointFile, Layout, Routing, StageState, Zero3Run

FP32 = 4


def capacity(tokens: int, experts: int, k: int, capacity_factor: float, min_capacity: int) -> int:
    """C = max(⌈tokens / experts · k · capacity factor⌉, min_capacity), as ``_capacity`` in
    ``deepspeed/moe/sharded_moe.py`` computes it (top-2 passes it capacity_factor · 2)."""
    return max(math.ceil(tokens / experts * capacity_factor * k), min_capacity)


def routing_rows(records: list[dict]) -> list[dict]:
    """Each gating run: capacity (the layer's and the formula's), expert counts, tokens dropped (counted from the
    layer's output) and the routes over capacity (from the counts)."""
    rows = []
    for r in read_as(records, Routing):
        C = capacity(r.tokens, r.experts, r.k, r.capacity_factor, r.min_capacity)
        rows.append({"k": r.k, "capacity factor": r.capacity_factor, "tokens": r.tokens, "C (layer)": r.capacity,
                     "C (formula)": C, "routes per expert": r.counts,
                     "routes over C": sum(max(0, c - C) for c in r.counts),
                     "tokens with no expert": r.dropped_tokens, "l_aux": round(r.l_aux, 4)})
    return rows


def balance_rows(records: list[dict], every: int = 5) -> list[dict]:
    """Every ``every``-th step of the two runs: tokens per expert (all ranks) without and with the auxiliary loss."""
    runs = {b.aux_coef: b for b in read_as(records, Balance)}
    rows = []
    for step in range(0, len(next(iter(runs.values())).counts), every):
        row = {"step": step}
        for coef, b in sorted(runs.items()):
            row[f"counts, aux {coef:g}"] = b.counts[step]
        rows.append(row)
    return rows


def imbalance(records: list[dict], last: int = 10) -> dict[float, dict]:
    """Per auxiliary-loss coefficient, over the last ``last`` steps: the busiest expert's tokens over the mean
    (1 is a perfect balance), and the fewest tokens any expert got."""
    out = {}
    for b in read_as(records, Balance):
        tail = b.counts[-last:]
        out[b.aux_coef] = {"busiest / mean": round(sum(max(c) / (sum(c) / len(c)) for c in tail) / len(tail), 3),
                           "fewest tokens": min(min(c) for c in tail), "final loss": round(b.losses[-1], 4)}
    return out


def layout_rows(*record_sets: list[dict]) -> list[dict]:
    """One row per launch, layout and rank: the experts it holds and their parameters against
    (experts / ep_size) × one expert's, its groups, and the all-to-all bytes of one step against the formula."""
    rows = []
    for records in record_sets:
        for r in read_as(records, Layout, rank=None):
            C = capacity(r.tokens, r.experts, r.k, r.capacity_factor, 4)
            buffer = r.experts * C * r.hidden * FP32                   # one all-to-all's input: E × C × h
            logged = sum(int(size) * n for size, n in r.alltoall.items())
            rows.append({"world": r.world_size, "layout": r.label, "ep_size": r.ep_size, "rank": r.rank,
                         "experts held": r.local_experts, "expert params": r.expert_numel,
                         "formula": r.experts // r.ep_size * r.one_expert_numel, "other params": r.dense_numel,
                         "expert-parallel group": r.ep_group, "expert-data-parallel group": r.expert_dp_group,
                         "C": r.capacity, "all-to-all bytes (logged, fwd+bwd)": logged,
                         "formula (4 · E·C·h·4 if ep > 1)": 4 * buffer if r.ep_size > 1 else 0,
                         "leave the rank per forward": logged // 2 * (r.ep_size - 1) // r.ep_size})
    return rows


def loss_gaps(*record_sets: list[dict]) -> dict[str, float]:
    """Per launch, the largest gap between the losses of each ep_size > 1 and those of ep_size 1 (rank 0)."""
    out = {}
    for records in record_sets:
        runs = {r.ep_size: r for r in read_as(records, Layout) if r.label.startswith("4 experts")}
        for ep, r in sorted(runs.items()):
            if ep > 1:
                out[f"{r.world_size} ranks, ep {ep} vs 1"] = max(abs(a - b) for a, b in zip(r.losses, runs[1].losses))
    return out


def zero_rows(records: list[dict]) -> list[dict]:
    """What each rank holds at ZeRO-0/1/2 with 4 experts over ep_size 2, against the formulas: fp32 weights 4 bytes
    per parameter held; AdamW's 2 moments (8 bytes) per parameter at stage 0; from stage 1 also ZeRO's fp32 copy
    (12 bytes), of 1/N of the other parameters and 1/(expert-data-parallel size) of this rank's experts."""
    rows = []
    for s in read_as(records, StageState, rank=None):
        if s.label != "course":
            continue
        world, ep = 2, 2
        held = s.expert_numel + s.dense_numel
        optimizer = 8 * held if s.stage == 0 else 12 * (s.dense_numel / world + s.expert_numel / (world // ep))
        rows.append({"stage": s.stage, "rank": s.rank, "params": s.measured["params"], "params formula": FP32 * held,
                     "optimizer": s.measured["optimizer"], "optimizer formula": int(optimizer),
                     "optimizer groups": ", ".join(f"{g['name']}{' (moe)' if g['moe'] else ''}: {g['numel']:,}"
                                                   for g in s.optimizer_groups)})
    return rows


def checkpoint_rows(records: list[dict]) -> list[dict]:
    return sorted(({"file": f.file, "written by rank": f.rank, "bytes": f.bytes}
                   for f in read_as(records, CheckpointFile, rank=None)), key=lambda r: (r["written by rank"], r["file"]))


def zero3_rows(records: list[dict]) -> list[dict]:
    rows = []
    for z in read_as(records, Zero3Run):
        rows.append({"run": z.label, "sparse block": z.block.rsplit(".", 1)[-1], "leaf modules": z.leaf_modules,
                     "outcome": z.outcome if z.outcome == "trained" else z.outcome.split(":")[0],
                     "fetches per step": z.fetches, "step ms": round(z.step_ms, 1),
                     "losses": [round(x, 4) for x in z.losses]})
    return rows


def gloo_complaint(rank_logs: dict[int, str]) -> dict[int, str]:
    """rank → the first line in which gloo or torch.distributed says why that rank's collective failed."""
    pattern = re.compile(r"(Received data size doesn't match.*|Connection reset by peer|Connection closed by peer)")
    out = {}
    for rank, text in sorted(rank_logs.items()):
        hit = pattern.search(text)
        if hit:
            line = text[:hit.end()].rsplit("\n", 1)[-1]
            out[rank] = re.sub(r"^.*?\]\s*", "", line, count=1) if "enforce fail" not in line else line.split("] ", 1)[-1]
    return out
