"""The count formulas the projections use: FLOPs of a training step, the bytes each rank sends per step in ZeRO's
collectives, the bytes a step moves between device, host and NVMe, a pipeline's bubble. (MoE's all-to-all count is
notebook 15's exercise: the notebook writes it and hands it to :mod:`.offload`.)

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


def step_flops(forward: float, recompute: bool | float = False, frozen_share: float = 0.0) -> float:
    """A training step: forward, and a backward of about twice the forward (gradients for the inputs and for the
    weights); activation checkpointing runs the forward once more in the backward pass. ``recompute``: the share of
    the forward run again (True: all of it, as DeepSpeed's flops profiler counts with ``recompute_fwd_factor`` 1.0;
    checkpointed blocks rerun less, :func:`course_utils.kernel.scale.compute.blocks_share`). Frozen weights (LoRA's
    base model) need no weight gradients: their share of the backward's second forward-sized half is skipped."""
    backward = (2 - frozen_share) * forward
    return forward + backward + float(recompute) * forward


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


def zero_sent(stage: int, params: float, world: int, b: float, regather: bool = True, reused: float = 0.0) -> float:
    """Bytes one rank sends per optimizer step at a ZeRO stage, as DeepSpeed 0.19.8 issues its collectives (notebook
    03, section 4, measured them): stage 0 all-reduces the gradients, 2(N−1)/N·Ψ; stages 1–2 all-reduce them and
    all-gather the updated partitions, 3(N−1)/N·Ψ; stage 3 gathers the parameters for forward and, once released,
    again for backward, and reduce-scatters the gradients: 3(N−1)/N·Ψ (2 when the gathered parameters survive until
    backward, ``regather=False``). Ψ counted in bytes: ``params`` × ``b``.

    Released parameters are gathered once per *use*: each module fetches its own parameters in its pre-forward and
    pre-backward hooks (``fetch_sub_module`` in ``runtime/zero/parameter_offload.py``) and releases them after. A
    weight that several modules share (GPT-2's token embedding tied to its output layer) is gathered again for each
    further module, in forward and in backward: ``reused`` counts those elements once per further module
    (:func:`course_utils.kernel.scale.wire.reused_numel` reads it off a model)."""
    if world <= 1:
        return 0.0
    share = (world - 1) / world
    units = {0: 2, 1: 3, 2: 3, 3: 3 if regather else 2}[stage]
    again = 2 * reused if stage == 3 and regather else 0.0
    return (units * params + again) * share * b


# ---------------------------------------------------------------- offload, bytes over the host link and to NVMe

def offload_moved(params: float, world: int, offload_optimizer: bool, offload_param: bool, b: float = 2,
                  stage: int | None = None, master: float = 4) -> dict:
    """Bytes one rank moves between its device and host memory per step with ZeRO-Offload, as DeepSpeed 0.19.8 copies
    them (notebook 04, section 6). ``b``: bytes of a 16-bit element; ``master``: of the fp32 master weights and
    gradients; ``stage``: 3 when ``offload_param`` (it needs stage 3), else 2 unless given.

    - offload_optimizer at stages 1–2 (``stage_1_and_2.py``): each gradient is converted to the master dtype on the
      device and copied into the host's fp32 gradient partition (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``),
      ``master`` bytes down; after the CPU step the partition goes up through a host 16-bit buffer
      (``param_buffer_of_bit16_for_cpu_offload_groups``), ``b`` up.
    - offload_optimizer at stage 3 (``stage3.py``, ``partition_grads``): the reduce-scattered 16-bit gradient is copied
      into the host's ``grad_partitions_flat_buffer`` and straight back to the device, then converted to fp32 there and
      copied into the host's fp32 gradient partition: ``b + master`` down, ``b`` up; without offload_param the updated
      16-bit partition goes up after the step, ``b``.
    - offload_param: every gather starts from the host shard (``ds_tensor.to(device)`` in ``partition_parameters.py``),
      once for forward and once for backward, ``2 b`` up; without offload_optimizer the step's 16-bit result goes down
      to the host shard, ``b``."""
    part = params / world
    stage = stage if stage is not None else (3 if offload_param else 2)
    down = up = 0.0
    if offload_optimizer:
        down += master * part
        if stage == 3:
            down += b * part
            up += b * part
        if not offload_param:
            up += b * part
    if offload_param:
        up += 2 * b * part
        if not offload_optimizer:
            down += b * part
    return {"to host": down, "to device": up}


def nvme_moved(params: float, world: int, offload_param: bool, b: float = 2, master: float = 4,
               swapped_grads: float | None = None, max_in_cpu: float = 1e9) -> dict:
    """Bytes one rank reads and writes on NVMe per step with ZeRO-Infinity (stage 3, both offloads to NVMe), as
    DeepSpeed 0.19.8's swappers do it (``runtime/swap_tensor/``; notebook 04, section 6):

    - backward writes each fp32 gradient partition to a swap file (``swap_out_gradients``) if it has at least 1 MiB,
      else keeps it in host memory: ``swapped_grads`` elements of the rank's ``params / world`` (default all of them);
    - the step reads the fp32 master partition, Adam's two moments and the swapped gradients, and writes the first
      three back (``swap_in_optimizer_state``, ``swap_out_optimizer_state``): ``3 · master`` bytes a parameter each way;
    - with offload_param, only the parameters beyond ``max_in_cpu`` elements per rank (``offload_param.max_in_cpu``,
      1e9 by default) live on NVMe: read for forward and for backward, written after the step, ``b`` bytes each time.
      The others are swapped in "permanently to CPU" when the engine starts (``_move_to_flat_buffer`` in
      ``stage3.py``) and stay in host memory."""
    part = params / world
    grads = part if swapped_grads is None else swapped_grads
    on_nvme = max(0.0, part - max_in_cpu) if offload_param else 0.0
    states = 3 * master * part
    return {"read": states + master * grads + 2 * b * on_nvme, "write": states + master * grads + b * on_nvme}


def bubble(stages: int, micro_batches: int) -> float:
    """A synchronous pipeline's idle share: (p − 1) / (m + p − 1), exactly in the steps of its schedule; in time only
    with equal passes and free hand-overs (:func:`course_utils.kernel.scale.compute.pipeline_step` adds them)."""
    return (stages - 1) / (micro_batches + stages - 1)
