"""Bytes on the wire, notebooks 01 and 03: the collective formulas of :mod:`.counts` beside what those notebooks' runs
measured, then carried to a real model on named GPUs as projections.

- notebook 01: :func:`ring_agreement` puts ``ring_sent("all_reduce", S, N)`` beside the bytes each rank's ring
  all-reduce sent; :func:`gradient_all_reduce` projects one all-reduce of a real model's gradients over a GPU link by
  the α–β model (α fitted on this machine, β from the link's published bandwidth);
- notebook 03: :func:`zero_agreement` puts ``zero_sent`` beside the bytes per rank that the comms logger's messages
  make; :func:`zero3_against_compute` sets ZeRO-3's collectives against a step's compute; :func:`model_states_table`
  puts the paper's bytes of model states per GPU beside DeepSpeed's own estimators.
"""
from __future__ import annotations

import math
from typing import Iterable

from course_utils.kernel.scale import counts, project, specs
from course_utils.kernel.scale.models import Size

GB = 1e9
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Elements per gradient all-reduce call: DeepSpeed's default reduce_bucket_size (runtime/zero/config.py), the same as
# the engine's MEMORY_OPT_ALLREDUCE_SIZE for the all-reduce without ZeRO (runtime/engine.py).
REDUCE_BUCKET = 500_000_000
# The mark of notebook 03's stage-3 run whose parameters are released after each use (scripts/03_zero_memory.py).
RELEASED = "released after use"
# Notebook 01: one machine of 8 GPUs on each GPU's own link, and 8 GPUs one per machine (every hop over the network).
GRADIENT_SETUPS = (("H100 80 GB", False), ("A100 40 GB", False), ("RTX 4090 24 GB", False), ("H100 80 GB", True))
# Notebook 03: 8 GPUs in one machine, and 64: 8 machines of 8, over the network.
GPUS_PER_MACHINE = 8
ZERO3_SETUPS = (("H100 80 GB", 8), ("A100 40 GB", 8), ("RTX 4090 24 GB", 8), ("H100 80 GB", 64))


def agreement_table(rows: list[dict]):
    """Agreement rows (:func:`counts.agreement`) as a table: the formula's count beside the measured one, the gap, and
    whether it is within the tolerance."""
    import pandas as pd

    return pd.DataFrame([{"count": r["count"], "formula": f"{r['formula']:,.0f}", "measured": f"{r['measured']:,.0f}",
                          "gap": f"{r['gap']:+.2%}", f"within {r['tolerance']:.0%}": r["within"]} for r in rows]
                        ).set_index("count")


# ---------------------------------------------------------------- notebook 01: the ring, then a real all-reduce

def ring_agreement(rings: list) -> list[dict]:
    """``ring_sent("all_reduce", S, N)`` beside the bytes each rank's ring all-reduce sent (its ``Ring`` record:
    ``bytes_sent``, counted at ``dist.send``/``isend`` by ``course_utils.rank.ring.count_sent_bytes``)."""
    return [counts.agreement(f"rank {r.rank}: bytes its ring all-reduce sent (N = {r.world_size}, "
                             f"S = {r.tensor_bytes:,} B): 2(N−1)/N·S",
                             counts.ring_sent("all_reduce", r.tensor_bytes, r.world_size), r.bytes_sent)
            for r in rings]


def gradient_all_reduce(model: Size, gpu: str, alpha: float, alpha_says: str, across_machines: bool = False,
                        gpus: int = 8, b: int = 2, efficiency: float = project.LINK_EFFICIENCY,
                        bucket: int = REDUCE_BUCKET) -> project.Projection:
    """One all-reduce of ``model``'s gradients (``b`` bytes each: 2 in bf16) over ``gpus`` GPUs by notebook 01's α–β
    model: α per call (``alpha`` seconds; ``alpha_says`` where it comes from) once per bucket of ``bucket`` elements,
    plus the bytes one GPU sends in a ring, 2(N−1)/N·S, at the link's published bandwidth × ``efficiency``. The link is
    the GPU's own between GPUs of one machine or, ``across_machines``, the network (one port per GPU)."""
    card = specs.gpu(gpu)
    link = specs.network() if across_machines else card.gpu_link
    grads = model.params * b
    terms = [project.Term("latency", math.ceil(model.params / bucket), "calls", 1 / alpha, alpha_says),
             project.link_term("all-reduce", counts.ring_sent("all_reduce", grads, gpus), link, efficiency)]
    assumptions = {"GPUs": gpus, "gradient bytes S": grads, "bytes per gradient": b,
                   "algorithm": "ring: each GPU sends 2(N−1)/N·S", "calls": f"one per bucket of {bucket:.0e} elements",
                   "latency": alpha_says, "link efficiency": efficiency, "sources": _said(card, link),
                   "overlap": "none: the all-reduce alone, nothing running beside it"}
    hardware = f"{gpus} × {card.name}" + (", one per machine" if across_machines else "")
    return project.Projection(f"{model.name}: all-reduce of {grads / GB:.3g} GB of gradients", hardware, terms,
                              assumptions)


def all_reduce_table(projections: list[project.Projection]):
    """Notebook 01's projections side by side: the link, the bytes a GPU sends, latency and bandwidth parts."""
    import pandas as pd

    rows = []
    for p in projections:
        latency, sent = p.terms
        rows.append({"projected on": p.hardware, "link, rate assumed": sent.rate_says,
                     "GB a GPU sends": sent.count / GB, "latency (ms)": 1e3 * latency.seconds,
                     "bytes (ms)": 1e3 * sent.seconds, "all-reduce (ms)": 1e3 * p.seconds,
                     "latency's share": latency.seconds / p.seconds})
    return pd.DataFrame(rows).set_index("projected on").round(3)


# ---------------------------------------------------------------- notebook 03: ZeRO's bytes per step, then ZeRO-3

def reused_numel(model) -> int:
    """Elements of the parameters that more than one module holds, counted once per further module (a weight tied
    between the token embedding and the output layer: once). ZeRO-3 gathers such a weight for every module that uses
    it when it releases parameters after use (:func:`counts.zero_sent`'s ``reused``)."""
    held = sum(p.numel() for m in model.modules() for p in m.parameters(recurse=False))
    return held - sum(p.numel() for p in model.parameters())


def _formula_says(stage: int, regather: bool) -> str:
    if stage == 3:
        return "(3Ψ + 2·reused)·(N−1)/N·b" if regather else "2(N−1)/N·Ψ·b"
    return "2(N−1)/N·Ψ·b" if stage == 0 else "3(N−1)/N·Ψ·b"


def zero_agreement(comm_rows: list[dict], reused: float = 0.0) -> list[dict]:
    """``zero_sent`` beside what a rank sent in one step, one row per run (world size, dtype, stage, released or not).

    The measured side is ``course_utils.kernel.views.zero.comm_rows``'s own conversion of the comms logger's messages
    into bytes a ring algorithm sends (``sent_per_rank_psi``, in units of Ψ × element bytes), summed over the run's
    collectives. ``reused``: :func:`reused_numel` of the model those runs trained."""
    runs: dict[tuple, dict] = {}
    for r in comm_rows:
        run = runs.setdefault((r["world_size"], r["dtype"], r["run"]), {"stage": r["stage"], "psi": r["num_params"],
                                                                         "sent": 0.0})
        run["sent"] += r["sent_per_rank_psi"] * r["num_params"] * ELEMENT_BYTES[r["dtype"]]
    rows = []
    for (n, dtype, label), run in runs.items():
        regather = RELEASED in label
        formula = counts.zero_sent(run["stage"], run["psi"], n, ELEMENT_BYTES[dtype], regather, reused)
        rows.append(counts.agreement(f"{label}, N = {n}, {dtype}: bytes a rank sends per step, "
                                     f"{_formula_says(run['stage'], regather)}", formula, run["sent"]))
    return rows


def zero3_against_compute(model: Size, setups: Iterable[tuple[str, int]] = ZERO3_SETUPS, tokens_per_gpu: int = 4096,
                          **assumptions) -> list[project.Projection]:
    """One ZeRO-3 step of ``model`` per (GPU, number of GPUs), bf16, ``tokens_per_gpu`` tokens each
    (:func:`project.step`; ``assumptions`` go to it: ``mfu``, ``efficiency``): its collectives, 3(N−1)/N·Ψ·2 bytes per
    GPU, set against its compute."""
    projections = []
    for gpu, n in setups:
        machines = -(-n // GPUS_PER_MACHINE)
        p = project.step(model, gpu, gpus=n, stage=3, tokens_per_gpu=tokens_per_gpu, gpus_per_node=GPUS_PER_MACHINE,
                         label=f"{model.name}, ZeRO-3" + (f", {machines} machines of {GPUS_PER_MACHINE}" if machines > 1
                                                          else ""), **assumptions)
        card = specs.gpu(gpu)
        p.assumptions["sources"] = _said(card, specs.network() if machines > 1 else card.gpu_link)
        projections.append(p)
    return projections


def hiding_table(projections: list[project.Projection]):
    """Per projection: compute and collectives in seconds, the share of compute the collectives take (what
    ``overlap_comm`` must hide behind it), and what is left showing when they take longer than compute."""
    import pandas as pd

    rows = []
    for p in projections:
        t = {term.name: term for term in p.terms}
        compute, comm = t["compute"].seconds, t["collectives"].seconds
        rows.append({"projected on": p.hardware, "link, rate assumed": t["collectives"].rate_says,
                     "compute (s)": compute, "collectives (s)": comm,
                     "collectives ÷ compute (overlap_comm must hide)": comm / compute,
                     "left showing (s)": max(0.0, comm - compute), "step (s)": p.seconds,
                     "model states per GPU (GB)": p.memory["device"] / GB})
    return pd.DataFrame(rows).set_index("projected on").round(3)


def _said(*figures) -> list[str]:
    """Each GPU's or link's name with the published source of its figures."""
    return [f"{x.name}: {x.source}" for x in figures]


def sources(gpus: Iterable[str], across_machines: bool = True) -> list[str]:
    """Where each figure comes from: the GPUs named, their links, and the network between machines."""
    cards = [specs.gpu(name) for name in dict.fromkeys(gpus)]
    links = list(dict.fromkeys([c.gpu_link for c in cards] + ([specs.network()] if across_machines else [])))
    return _said(*cards, *links)


def model_states_table(model: Size, gpus: Iterable[int] = (1, 8, 64), gpus_per_node: int = GPUS_PER_MACHINE,
                       dtype: str = "bf16"):
    """GB of model states per GPU at stages 0–3: the ZeRO paper's formula (``zero_rules.zero_formula``) beside
    DeepSpeed's own estimators (``estimate_zero2/3_model_states_mem_needs``, without offload: stages 2 and 3 only),
    from the meta device's exact parameter count and largest module (the estimators' ``largest_layer_params``)."""
    import pandas as pd

    from course_utils.common.zero_rules import zero_formula
    from course_utils.kernel.planning import estimator_rows

    rows = []
    for n in gpus:
        per_node = min(n, gpus_per_node)
        estimated = {r["stage"]: r["gpu_bytes"] for r in estimator_rows(model.params, model.largest_layer, per_node,
                                                                         n // per_node)
                     if not r["offload_optimizer"] and not r["offload_param"]}
        for stage in range(4):
            paper = zero_formula(model.params, stage, n, dtype)["total"]
            rows.append({"GPUs": n, "stage": stage, "ZeRO paper (GB)": paper / GB,
                         "DeepSpeed's estimator (GB)": estimated[stage] / GB if stage in estimated else float("nan")})
    table = pd.DataFrame(rows).pivot(index="stage", columns="GPUs")
    return table.swaplevel(axis=1).sort_index(axis=1, level=0, sort_remaining=False).round(1)
