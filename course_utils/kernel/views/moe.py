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
    (experts / ep_size) × one expert's, its groups, and the all-to-all bytes DeepSpeed's comms logger logged in one
    step, in its forward, and the share of the forward's that left the rank (an all_to_all_single over a group of g ranks
    keeps one g-th of its input at home and sends the rest, one slice to each other rank)."""
    rows = []
    for records in record_sets:
        for r in read_as(records, Layout, rank=None):
            logged = sum(int(size) * n for size, n in r.alltoall.items())
            forward = sum(int(size) * n for size, n in r.alltoall_forward.items())
            g = len(r.ep_group)
            rows.append({"world": r.world_size, "layout": r.label, "ep_size": r.ep_size, "rank": r.rank,
                         "experts held": r.local_experts, "expert params": r.expert_numel,
                         "formula": r.experts // r.ep_size * r.one_expert_numel, "other params": r.dense_numel,
                         "expert-parallel group": r.ep_group, "expert-data-parallel group": r.expert_dp_group,
                         "C": r.capacity, "all-to-all bytes (logged, fwd+bwd)": logged,
                         "logged in the forward": forward, "leave the rank per forward": forward * (g - 1) // g})
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


def zero3_runs(records: list[dict]) -> list[Zero3Run]:
    """Each run of ``scripts/15_moe_zero3.py`` once, as rank 0 recorded it; a run rank 0 did not live to record, as
    another rank did (the last run's mismatched collective makes gloo abort one rank, not always the same one)."""
    runs: dict[str, Zero3Run] = {}
    for z in read_as(records, Zero3Run, rank=None):      # rank 0's records first
        runs.setdefault(z.label, z)
    return list(runs.values())


def zero3_rows(records: list[dict]) -> list[dict]:
    rows = []
    for z in zero3_runs(records):
        rows.append({"run": z.label, "sparse block": z.block.rsplit(".", 1)[-1], "leaf modules": z.leaf_modules,
                     "outcome": z.outcome if z.outcome == "trained" else z.outcome.split(":")[0],
                     "fetches per step": z.fetches, "step ms": round(z.step_ms, 1),
                     "losses": [round(x, 4) for x in z.losses]})
    return rows


def random_id_loss() -> float:
    """ln 125: the loss of the best guess on random ids of the 125 ids that section 5's sequences use (ids 0-2 are
    special tokens), which only a model that learned the sequences' rule gets below."""
    from course_utils.rank import moe

    return math.log(moe.VOCAB - moe.FIRST_ID)


_ABORT = re.compile(r"terminate called after throwing an instance of '[^']+'")


def launcher_exit(log: str) -> int | None:
    """The return code DeepSpeed's launcher ended the launch with, from the line its ``sigkill_handler`` logs
    (``deepspeed/launcher/launch.py``: "<command> exits with return code = <code>"); None when no rank failed. The
    command in that line is the last rank the launcher started, whichever rank failed, so it names no rank."""
    from course_utils.kernel.launch.failures import launcher_exit as ended

    hit = ended(log)
    return hit[0] if hit else None


def native_aborts(rank_logs: dict[int, str]) -> dict[int, str]:
    """rank → the C++ runtime's line before it aborted the rank (SIGABRT), for the ranks that have one."""
    return {rank: hit[0] for rank, text in sorted(rank_logs.items()) if (hit := _ABORT.search(text))}


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


# ---------------------------------------------------------------- exercises 2 and 3: what DeepSpeed would refuse, found
# before any rank starts

def optimizer_problem(moe_zero2) -> str | None:
    """What is wrong with the param groups of the optimizer ``moe_zero2(model)`` builds for the 4-expert model with
    ``ep_size`` 2, built here in the kernel (its expert parameters carry DeepSpeed's marks without any process group);
    None when each group holds either expert or other parameters, and every group of expert parameters is marked
    ``moe`` and named after their expert group, as ZeRO-1/2 needs to partition and reduce them over it."""
    from course_utils.rank import moe

    try:
        config, optimizer = moe_zero2(moe.MoENet(4, 2))
    except NotImplementedError:
        raise
    except Exception as error:                        # noqa: BLE001 - the learner's code: say what it raised
        return f"moe_zero2(model) raised {type(error).__name__}: {error}"
    if not isinstance(config, dict) or "optimizer" in config:
        return "the config must be a dict without an optimizer section: your optimizer is the one DeepSpeed uses."
    for g in moe.given_groups(optimizer):
        if g["expert_numel"] and g["other_numel"]:
            return (f"a group{' ' + repr(g['name']) if g['name'] else ''} holds expert parameters and other parameters "
                    "together: ZeRO partitions a group over one process group.")
        if g["expert_numel"] and not g["moe"]:
            return ("expert parameters sit in a group that is not marked as an MoE group: ZeRO would partition and "
                    "reduce them over every rank, like the others, and with no group marked DeepSpeed refuses the "
                    "optimizer.")
        if g["moe"] and g["name"] not in g["expert_groups"]:
            return (f"a group marked moe is named {g['name']!r}: ZeRO looks up the process group of an MoE group by "
                    "the group's name, which must be the expert group of its parameters.")
    return None


def leaf_problem(section) -> str | None:
    """What is wrong with a ``zero_optimization.leaf_module`` section for section 5's expert-list model (the tiny OLMoE
    with :class:`course_utils.rank.moe.ExpertListBlock` blocks), found before any rank starts: DeepSpeed's own config
    class reads it and DeepSpeed's own matching marks the leaves of the model built here. None when every leaf runs a
    forward of its own (ZeRO-3 gathers a leaf's parameters when the leaf runs; a ``ModuleList`` never does), every
    sparse block is a leaf or lies inside one, and no leaf holds more than a sparse block (a leaf is gathered whole)."""
    import copy

    from deepspeed.runtime.zero.leaf_module_config import DeepSpeedZeroLeafModuleConfig
    from deepspeed.utils.z3_leaf_module import apply_zero_leaf_module_config
    from torch import nn

    from course_utils.rank import moe

    if not isinstance(section, dict):
        return "return a dict: the leaf_module section of zero_optimization."
    try:
        parsed = DeepSpeedZeroLeafModuleConfig(**section)
    except Exception as error:                        # noqa: BLE001 - DeepSpeed's own words
        return f"DeepSpeed's config class refuses your section: {str(error).splitlines()[0]} …"
    model = copy.deepcopy(_expert_list_model())
    leaves = apply_zero_leaf_module_config(model, parsed)
    if not leaves:
        return "with your section DeepSpeed marks no module of this model as a leaf."
    idle = [type(mod).__name__ for mod in leaves if type(mod).forward is nn.Module.forward]
    if idle:
        return (f"DeepSpeed marks {len(leaves)} leaf module(s), and {idle[0]} is a container that never runs a forward "
                "of its own: ZeRO-3 gathers a leaf's parameters when the leaf runs.")
    inside = {id(sub) for leaf in leaves for sub in leaf.modules()}
    if not all(id(mod) in inside for mod in model.modules() if isinstance(mod, moe.ExpertListBlock)):
        return (f"DeepSpeed marks {len(leaves)} leaf module(s) with your section, and the modules that choose which "
                "experts run are not inside any of them: ZeRO-3 would still gather the experts one by one, only for "
                "the tokens each rank has.")
    larger = [type(leaf).__name__ for leaf in leaves if not isinstance(leaf, moe.ExpertListBlock)
              and any(isinstance(sub, moe.ExpertListBlock) for sub in leaf.modules())]
    if larger:
        return (f"DeepSpeed marks {len(leaves)} leaf module(s) with your section, and {larger[0]} holds more than the "
                "module that chooses which experts run: ZeRO-3 would gather all of it whole, on every rank, at once.")
    return None


_MODEL = []


def _expert_list_model():
    """Section 5's expert-list model, built once in the kernel (for :func:`leaf_problem`)."""
    from course_utils.rank import moe

    if not _MODEL:
        _MODEL.append(moe.with_expert_lists(moe.tiny_moe_lm("OLMoE")))
    return _MODEL[0]
