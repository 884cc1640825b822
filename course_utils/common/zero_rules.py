"""The ZeRO arithmetic, defined once for the ranks and the notebooks: model-state bytes per rank and
where offload puts them.

* :func:`zero_formula` is the paper's model-state memory per rank (Rajbhandari et al., "ZeRO", 2020):
  with mixed-precision Adam a model of Ψ parameters needs 2Ψ (16-bit parameters) + 2Ψ (16-bit
  gradients) + 12Ψ (fp32 master weights, momentum, variance) bytes, and stages 1, 2, 3 divide the
  last one, the last two, all three by the number of ranks N.
* :func:`deepspeed_expected` is that formula with what DeepSpeed 0.19 does differently on purpose;
  :func:`edge_grad_numel` computes its stage 1–2 gradient term from the parameters' sizes.
* :data:`OFFLOAD_MOVES` says what ``offload_optimizer`` and ``offload_param`` move to the host; the
  ladder's prediction (notebook 04) and the calculator (notebook 05) split bytes with :func:`placement`.
  Notebook 04 measures the placement from the tensors instead (structure and device of each) and its
  test compares that measurement with this prediction.

Standard library only: the notebook imports it without torch.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

GB = 1e9        # the paper's GB (10⁹ bytes)
STATES = ("params", "grads", "optimizer")

# bytes per parameter of each model state, before partitioning
BYTES_PER_PARAM = {
    # 16-bit params + 16-bit grads + (fp32 master + fp32 momentum + fp32 variance) = 2 + 2 + 12
    "bf16": {"params": 2, "grads": 2, "optimizer": 12},
    "fp16": {"params": 2, "grads": 2, "optimizer": 12},
    # fp32 training: params and grads are already fp32, Adam keeps momentum + variance = 4 + 4 + 8
    "fp32": {"params": 4, "grads": 4, "optimizer": 8},
}
# which states a stage partitions across the data-parallel ranks
PARTITIONED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}

# What each offload option of ``zero_optimization`` moves off the accelerator. ``offload_optimizer``
# moves the optimizer states *and* the gradient partition the host-side optimizer steps on: DeepSpeed's
# estimators count only the 16-bit parameters on the GPU with it (estimate_zero2_model_states_mem_needs:
# 2Ψ with cpu_offload; stage 3: 2Ψ/N), and stage_1_and_2.py copies each reduced gradient partition to
# the host (async_accumulate_grad_in_cpu_via_gpu). ``offload_param`` (stage 3) moves the parameters.
OFFLOAD_MOVES = {"offload_optimizer": ("optimizer", "grads"), "offload_param": ("params",)}


def _check_stage_dtype(stage: int, dtype: str) -> None:
    if stage not in PARTITIONED:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage!r}.")
    if dtype not in BYTES_PER_PARAM:
        raise ValueError(f"dtype must be one of {sorted(BYTES_PER_PARAM)}, not {dtype!r}.")


def zero_formula(num_params: float, stage: int, world_size: int, dtype: str = "bf16") -> dict[str, float]:
    """Model-state bytes per rank by the ZeRO paper: {"params", "grads", "optimizer", "total"}.

    ``dtype="bf16"`` (or ``"fp16"``) is mixed-precision Adam: 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N for
    stages 0–3. ``dtype="fp32"`` is plain fp32 Adam: 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N.
    """
    _check_stage_dtype(stage, dtype)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}.")
    out = {k: num_params * b / (world_size if k in PARTITIONED[stage] else 1)
           for k, b in BYTES_PER_PARAM[dtype].items()}
    out["total"] = sum(out.values())
    return out


def paper_example(num_params: float = 7.5e9, world_size: int = 64) -> dict[str, float]:
    """The paper's Figure 1 example in GB per rank for stages 0–3 (7.5 B parameters, 64 ranks:
    120, 31.4, 16.6 and 1.9 GB)."""
    return {str(s): zero_formula(num_params, s, world_size, "bf16")["total"] / GB for s in range(4)}


def deepspeed_expected(num_params: int, stage: int, world_size: int, dtype: str,
                       grad_partition_numel: int | None = None, persistent_numel: int = 0) -> dict[str, float]:
    """The paper's formula adjusted for what DeepSpeed 0.19 does on purpose (read in its code):

    - **fp32 master copy in fp32 too** (stages 1–3): ``single_partition_of_fp32_groups`` (stage 1/2)
      and ``fp32_partitioned_groups_flat`` (stage 3) are ``.clone().float()`` of the partition even when
      the model is already fp32, so the optimizer side holds 4Ψ/N more than momentum + variance.
    - **stage 1 partitions gradients too** (at an accumulation boundary): with
      ``gradient_accumulation_steps = 1`` every backward ends on a boundary, and stage_1_and_2.py
      then reduces each bucket into ``grads_in_partition`` exactly as stage 2 does.
    - **boundary parameters** (stages 1/2): ``grads_in_partition`` is sized by the *whole* parameters
      that touch this rank's partition (``params_in_partition``), so a rank holds the full gradient
      of a parameter that straddles its partition's edge: pass ``grad_partition_numel`` to use it.
    - **persistent parameters** (stage 3): parameters with at most
      ``stage3_param_persistence_threshold`` elements stay whole on every rank next to their shard.
    """
    out = zero_formula(num_params, stage, world_size, dtype)
    per = BYTES_PER_PARAM[dtype]
    if dtype == "fp32" and stage >= 1:
        out["optimizer"] += 4 * num_params / world_size
    if stage in (1, 2):
        out["grads"] = per["grads"] * (grad_partition_numel or num_params / world_size)
    if stage == 3:
        out["params"] += per["params"] * persistent_numel
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def edge_grad_numel(param_numels: Sequence[int], world_size: int, rank: int,
                    element_size: int = 4, parameter_alignment: bool = False) -> int:
    """Stages 1–2: elements of the gradient buffer ``grads_in_partition`` of ``rank``, computed from the
    parameters' sizes alone, by DeepSpeed 0.19.8's partitioning rules (``DeepSpeedZeroOptimizer.__init__``
    and ``get_partition_info`` in ``runtime/zero/stage_1_and_2.py``), for one parameter group in the order
    it was given:

    - with ``parameter_alignment`` each parameter but the last is padded to ``16 // gcd(16, element_size)``
      elements (off by default: no padding);
    - the flat buffer is padded to a multiple of ``nccl_start_alignment_factor (2) × world_size`` and cut into
      ``world_size`` equal partitions;
    - a parameter belongs to the rank's partition when it starts inside it or straddles its start, and the
      buffer holds every such parameter *whole*.
    """
    align_each = 16 // math.gcd(16, element_size) if parameter_alignment else 1
    starts, offset = [], 0
    for i, n in enumerate(param_numels):
        starts.append(offset)
        offset += n + (0 if i == len(param_numels) - 1 else (-(offset + n)) % align_each)
    alignment = 2 * world_size
    flat = -(-offset // alignment) * alignment
    size = flat // world_size
    first, end = size * rank, size * (rank + 1)
    return sum(n for s, n in zip(starts, param_numels) if first <= s < end or s < first < s + n)


# ---------------------------------------------------------------- offload: where the states live

def offloaded(zero: Mapping) -> set[str]:
    """The model states a ``zero_optimization`` section sends to the host (``"device": "none"`` sends none)."""
    return {state for key, states in OFFLOAD_MOVES.items()
            if key in zero and (zero[key] or {}).get("device", "cpu") != "none" for state in states}


def offload_flags(zero: Mapping) -> tuple[bool, bool, bool]:
    """(offloads the optimizer states, offloads the parameters, to NVMe) of a ``zero_optimization`` section."""
    devices = {(zero.get(key) or {}).get("device", "cpu") for key in OFFLOAD_MOVES if key in zero}
    moved = offloaded(zero)
    return "optimizer" in moved, "params" in moved, "nvme" in devices


OPTIMIZER_TO_HOST = {"offload_optimizer": {"device": "cpu"}}
STATES_TO_HOST = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}

# The offload ladder in its documented order (fastest / most accelerator memory first): rung → (ZeRO stage, what it
# adds to zero_optimization). Notebook 04 runs these rungs; notebook 05's out-of-memory ladder climbs the same ones.
LADDER = {
    "stage 0": (0, {}),
    "stage 1": (1, {}),
    "stage 2": (2, {}),
    "stage 2 + offload": (2, OPTIMIZER_TO_HOST),
    "stage 3": (3, {}),
    "stage 3 + offload": (3, STATES_TO_HOST),
}


def placement(states: Mapping[str, float], zero: Mapping) -> dict[str, dict[str, float]]:
    """Each model state's bytes split into ``{"device": …, "host": …}`` by what ``zero`` offloads."""
    moved = offloaded(zero)
    return {s: {"device": 0 if s in moved else states[s], "host": states[s] if s in moved else 0} for s in STATES}


def per_rank_placement(num_params: float, stage: int, world_size: int, dtype: str,
                       zero: Mapping) -> dict[str, dict[str, float]]:
    """Bytes per rank of each model state by the paper's formula, on the accelerator and on the host
    for the offload options in ``zero``: what notebook 04 predicts and notebook 05's calculator shows."""
    return placement(zero_formula(num_params, stage, world_size, dtype), zero)


def predicted_device_bytes(num_params: float, stage: int, world_size: int, dtype: str, zero: Mapping) -> float:
    """Model-state bytes per rank left on the accelerator (:func:`per_rank_placement`, summed)."""
    return sum(p["device"] for p in per_rank_placement(num_params, stage, world_size, dtype, zero).values())
