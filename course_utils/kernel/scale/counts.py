"""The count formulas the projections use: FLOPs of a training step, the bytes each rank sends per step in ZeRO's
collectives, the bytes a step moves between device, host and NVMe, a pipeline's bubble, MoE's all-to-all.

Counts do not depend on the hardware, so each formula can be checked where the course runs: a notebook first puts it
beside the count its own run measured at toy size (:func:`agreement`: the comms logger's bytes, the placement walk's
bytes, the flops profiler's FLOPs) and only then uses it at real size. ``b`` is bytes per element throughout."""
from __future__ import annotations

AGREE = 0.03      # a formula "reproduces" a measured count when it is within 3 % of it


def agreement(what: str, formula: float, measured: float, rel: float = AGREE) -> dict:
    """One row of a notebook's agreement table: the formula's count beside the run's measured count."""
    gap = formula / measured - 1 if measured else float("inf")
    return {"count": what, "formula": float(formula), "measured": float(measured), "gap": gap,
            "within": abs(gap) <= rel, "tolerance": rel}


# ---------------------------------------------------------------- compute

def forward_flops(matmul_params: float, tokens: float, layers: int = 0, hidden: int = 0, seq: int = 0) -> float:
    """FLOPs of a forward pass over ``tokens``: 2 per parameter a token multiplies with, plus attention's scores and
    weighted sum, 4·seq·hidden per token and layer (counted whole, as DeepSpeed's flops profiler counts them)."""
    return 2 * matmul_params * tokens + 4 * layers * seq * hidden * tokens


def step_flops(forward: float, recompute: bool = False, frozen_share: float = 0.0) -> float:
    """A training step: forward, and a backward of about twice the forward (gradients for the inputs and for the
    weights); activation checkpointing runs the forward once more. Frozen weights (LoRA's base model) need no weight
    gradients: their share of the backward's second forward-sized half is skipped."""
    backward = (2 - frozen_share) * forward
    return forward + backward + (forward if recompute else 0.0)


# ---------------------------------------------------------------- collectives, bytes one rank sends

def ring_sent(op: str, message_bytes: float, world: int) -> float:
    """What one rank sends for one collective by the ring algorithms, from the comms logger's message size (an
    all_reduce's buffer, an all_gather's input shard, a reduce_scatter's whole input: ``deepspeed/comm/utils.py``)."""
    n = world
    if op == "all_reduce":
        return 2 * (n - 1) / n * message_bytes
    if op in ("all_gather", "all_gather_into_tensor", "allgather_fn"):
        return (n - 1) * message_bytes
    if op in ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_fn"):
        return (n - 1) / n * message_bytes
    if op == "all_to_all_single":
        return (n - 1) / n * message_bytes
    raise ValueError(f"no ring rule for {op!r}")


def zero_sent(stage: int, params: float, world: int, b: float, regather: bool = True) -> float:
    """Bytes one rank sends per optimizer step at a ZeRO stage, as DeepSpeed 0.19.8 issues its collectives (notebook
    03, section 4, measured them): stage 0 all-reduces the gradients, 2(N−1)/N·Ψ; stages 1–2 all-reduce them and
    all-gather the updated partitions, 3(N−1)/N·Ψ; stage 3 gathers the parameters for forward and, once released,
    again for backward, and reduce-scatters the gradients: 3(N−1)/N·Ψ (2 when the gathered parameters survive until
    backward, ``regather=False``). Ψ counted in bytes: ``params`` × ``b``."""
    if world <= 1:
        return 0.0
    share = (world - 1) / world
    units = {0: 2, 1: 3, 2: 3, 3: 3 if regather else 2}[stage]
    return units * share * params * b


def all_to_all_sent(experts: int, capacity: int, hidden: int, ep: int, b: float) -> float:
    """Bytes one rank sends in one MoE layer's forward: two all-to-alls (dispatch, combine) of the E·C·h buffer (sized by
    capacity, empty slots included: notebook 15), each keeping 1/ep of it at home."""
    return 2 * experts * capacity * hidden * b * (ep - 1) / ep


# ---------------------------------------------------------------- offload, bytes over the host link and to NVMe

def offload_moved(params: float, world: int, offload_optimizer: bool, offload_param: bool, b: float = 2) -> dict:
    """Bytes one rank moves between its device and host memory per step with ZeRO-Offload: its gradient partition down
    and its updated parameter partition up (offload_optimizer); with offload_param the parameter partition comes up for
    forward and again for backward, and stays on the host after the step. ``b``: bytes of a 16-bit element."""
    part = params / world * b
    down = part if (offload_optimizer or offload_param) else 0.0
    if offload_param:
        up = 2 * part
    elif offload_optimizer:
        up = part
    else:
        up = 0.0
    return {"to host": down, "to device": up}


def nvme_moved(params: float, world: int, offload_param: bool, b: float = 2) -> dict:
    """Bytes one rank reads and writes on NVMe per step with ZeRO-Infinity: the fp32 master weights and Adam's two
    moments (12 bytes a parameter) read and written back by the optimizer step, and with offload_param the 16-bit
    parameters read for forward and for backward and written once after the step."""
    part = params / world
    read = 12 * part + (2 * b * part if offload_param else 0.0)
    write = 12 * part + (b * part if offload_param else 0.0)
    return {"read": read, "write": write}


def bubble(stages: int, micro_batches: int) -> float:
    """A synchronous pipeline's idle share: (p − 1) / (m + p − 1)."""
    return (stages - 1) / (micro_batches + stages - 1)
