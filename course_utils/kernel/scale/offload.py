"""Real scale for notebooks 04 (ZeRO-Offload and ZeRO-Infinity) and 15 (MoE's all-to-all): the count formulas of
:mod:`.counts` put beside what those notebooks' runs measured, then used at real size.

- 04: the bytes an offloaded step moves between device, host and NVMe are set by the partitions DeepSpeed keeps on
  each side. :func:`offload_agreement` puts :func:`.counts.offload_moved` and :func:`.counts.nvme_moved` beside the
  partitions the ladder found (its ``Rung`` records); :func:`cpu_adam_rate` turns the ladder's timed optimizer kernel
  into DeepSpeedCPUAdam's seconds per parameter on one core; :func:`offload_projections` projects a Llama-3-8B-shaped
  step with offload on GPUs of the hardware table.
- 15: :func:`alltoall_agreement` puts the notebook's own count of the bytes a rank sends in an MoE layer's forward (a
  function the notebook writes after its exercise 1 asked for that count, and hands in) beside the bytes each rank's
  comms logger measured; :func:`moe_projections` carries the same count to a Mixtral-8x7B-shaped stack of MoE layers:
  all-to-all against expert compute.
"""
from __future__ import annotations

import math
import os
import statistics

from typing import Callable

from course_utils.common.record import read_as
from course_utils.common.records.moe import Layout
from course_utils.common.records.offload import Rung
from course_utils.kernel.scale import counts, models, project, specs
from course_utils.kernel.scale.project import Projection
from course_utils.kernel.views import moe as views

GB = 1e9
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MASTER_BYTES = 4            # fp32 master weights, their gradients and Adam's moments
# DeepSpeed's swappers write a tensor to a file only from 1 MiB on: MIN_AIO_BYTES in runtime/swap_tensor/utils.py,
# raised to the aio block_size (1 MiB by default) in partitioned_param_swapper.py and optimizer_utils.py
MIN_SWAP_BYTES = 2**20


# ---------------------------------------------------------------- notebook 04: the count check at toy size

def swapped_numel(numels: list[int], world: int, element_bytes: int, min_bytes: int = MIN_SWAP_BYTES) -> int:
    """Elements of one rank's partitions that DeepSpeed's swappers write to files: each parameter is split into
    ⌈numel / world⌉ elements a rank (``_aligned_size`` pads it to the world size, ``partition_parameters.py``); a
    partition under ``min_bytes`` in the swapper's dtype is kept in host memory instead (``swappable_tensor`` in
    ``partitioned_param_swapper.py``, ``is_swappable_tensor`` and ``_swap_out_gradients`` in ``optimizer_utils.py``)."""
    parts = (math.ceil(n / world) for n in numels)
    return sum(p for p in parts if p * element_bytes >= min_bytes)


def fp16_supported(accelerator: str) -> bool:
    """Whether DeepSpeed's accelerator reports fp16 support: CUDA from compute capability 7 (every GPU of the hardware
    table; ``cuda_accelerator.py``), the CPU only where oneDNN has fp16 (``cpu_accelerator.py``)."""
    if accelerator != "cpu":
        return True
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:        # noqa: BLE001 — DeepSpeed's CPU accelerator answers False the same way
        return False


def parameter_swapper_bytes(dtype: str, accelerator: str) -> int:
    """Bytes of an element in the parameter swapper's files: ``zero.Init`` keeps the model's dtype only where the
    accelerator reports fp16 support, and takes bfloat16 elsewhere (``Init._set_dtype`` in ``partition_parameters.py``,
    notebook 04 section 3): an fp32 model on a CPU swaps its parameters in bf16."""
    return ELEMENT_BYTES[dtype] if fp16_supported(accelerator) else ELEMENT_BYTES["bf16"]


def _held(rung: Rung, state: str, tails: tuple[str, ...], side: str = "host") -> int:
    """Bytes of ``state`` the ladder's walk found on ``side`` in DeepSpeed structures whose names end with ``tails``."""
    return sum(h.bytes for h in rung.held if h.state == state and h.side == side and h.structure.endswith(tails))


FP32_GRAD_PARTITION = ("single_partition_of_fp32_groups[i].grad", "['params'][i].grad",     # stages 1-2, either path
                       "fp32_partitioned_groups_flat[i].grad")                              # stage 3
GRAD_BUFFER = ("grad_partitions_flat_buffer",)                    # stage 3: the 16-bit gradient partition on the host
BIT16_COPY = ("param_buffer_of_bit16_for_cpu_offload_groups[i]",)  # stages 1-2: the updated partition, 16-bit
PARAM_SHARD = ("module parameter.ds_tensor",)                     # stage 3: each parameter's shard
MOMENTS = ("['exp_avg']", "['exp_avg_sq']")
MASTER = ("single_partition_of_fp32_groups[i]", "fp32_partitioned_groups_flat[i]")


def offload_agreement(by_name: dict[str, Rung], params: int, world: int, numels: list[int]) -> list[dict]:
    """Notebook 04's count check: what :func:`.counts.offload_moved` and :func:`.counts.nvme_moved` say one rank moves
    per step, beside the bytes of the partitions each copy reads or writes, as the ladder's walk found them after the
    last backward (``by_name``: its rungs by name; ``params``: the model's; ``numels``: each parameter's elements).

    The rows' element sizes are the run's: an fp32 run (a CPU) has 4 bytes for its "16-bit" elements too."""
    rows = []
    b = ELEMENT_BYTES[next(iter(by_name.values())).dtype]          # every rung trains in the run's dtype
    two = by_name.get("stage 2 + offload")
    if two is not None:
        moved = counts.offload_moved(params, world, True, False, b, stage=2)
        rows += [counts.agreement("stage 2 + offload, to host: the fp32 gradient partition on the host",
                                  moved["to host"], _held(two, "grads", FP32_GRAD_PARTITION)),
                 counts.agreement("stage 2 + offload, to device: the host's 16-bit copy of the updated partition",
                                  moved["to device"], _held(two, "buffers", BIT16_COPY))]
    three = by_name.get("stage 3 + offload")
    if three is not None:
        moved = counts.offload_moved(params, world, True, True, b, stage=3)
        grad_buffer = _held(three, "grads", GRAD_BUFFER)
        rows += [counts.agreement("stage 3 + offload, to host: the 16-bit gradient buffer + the fp32 gradient partition",
                                  moved["to host"], grad_buffer + _held(three, "grads", FP32_GRAD_PARTITION)),
                 counts.agreement("stage 3 + offload, to device: the gradient buffer back + the parameter shards, "
                                  "gathered for forward and for backward (2×)", moved["to device"],
                                  grad_buffer + 2 * _held(three, "params", PARAM_SHARD)),
                 counts.agreement("stage 3 + offload, on the host: fp32 master partition + Adam's 2 moments "
                                  "(what NVMe offload reads and writes back every step; it also reads the swapped gradients)",
                                  counts.nvme_moved(params, world, False, b, swapped_grads=0)["read"],
                                  _held(three, "optimizer", MASTER + MOMENTS))]
    nvme = by_name.get("stage 3 + NVMe")
    if nvme is not None:
        grads = swapped_numel(numels, world, MASTER_BYTES)
        swap_b = parameter_swapper_bytes(nvme.dtype, nvme.accelerator)
        written = counts.nvme_moved(params, world, True, b, swapped_grads=grads)["write"]
        at_start = swap_b * swapped_numel(numels, world, swap_b)
        # counted to the byte; the smallest part, the parameters' file, is about 3 % of the whole here
        rows.append(counts.agreement(f"stage 3 + NVMe, swap files: a step's optimizer states and fp32 gradients + the "
                                     f"parameters written at start ({swap_b}-byte elements)", written + at_start,
                                     nvme.nvme_bytes, rel=0.005))
    return rows


# ---------------------------------------------------------------- notebook 04: DeepSpeedCPUAdam's rate

def kernel_cores(world: int, gpu: bool) -> int:
    """The cores one rank's DeepSpeedCPUAdam had while the ladder timed it. Its OpenMP loop runs ``OMP_NUM_THREADS``
    threads: the course gives CPU ranks this machine's cores ÷ ranks (``hardware.cpu_ranks_env``) unless the environment
    sets it; GPU ranks keep OpenMP's default, every core. All ranks step at once, so a rank has at most cores ÷ ranks."""
    from course_utils.kernel import hardware

    cores = os.cpu_count() or 1
    threads = os.environ.get("OMP_NUM_THREADS") or (cores if gpu else hardware.cpu_ranks_env(world)["OMP_NUM_THREADS"])
    return max(1, min(int(threads), cores // max(1, world)))


def cpu_adam_rate(rungs: list[Rung], params_on_rank: float, cores: int) -> tuple[float, dict[str, float]]:
    """DeepSpeedCPUAdam's seconds per parameter on one core, measured here: each offload rung's optimizer kernel (the
    median ``phases["optimizer kernel"]`` of its timed steps) over the parameters of the rank's partition, times the
    cores it ran on. Returns the median over the rungs and each rung's figure."""
    each = {r.name: r.phases["optimizer kernel"] / params_on_rank * cores for r in rungs
            if r.optimizer == "DeepSpeedCPUAdam" and r.phases}
    if not each:
        raise ValueError("no rung ran DeepSpeedCPUAdam: pass the ladder's offload rungs (section 2 of notebook 04)")
    return statistics.median(each.values()), each


# ---------------------------------------------------------------- notebook 04: the projection

OFFLOAD_MODEL = "Llama-3-8B shape"
OFFLOAD_MACHINES = (("RTX 4090 24 GB", 1), ("H100 80 GB", 8))
OFFLOAD_CONFIGS = {"ZeRO-2 + offload_optimizer": dict(stage=2, offload_optimizer=True),
                   "ZeRO-3 + offload (CPU)": dict(stage=3, offload_optimizer=True, offload_param=True),
                   "ZeRO-3 + NVMe": dict(stage=3, offload_optimizer=True, offload_param=True, nvme=True)}
OFFLOAD_TERMS = ("offload transfers", "CPU Adam", "NVMe", "NVMe write")


def offload_projections(cpu_adam_s_per_param_core: float, model: str = OFFLOAD_MODEL,
                        machines: tuple = OFFLOAD_MACHINES, host_cores: int = project.HOST_CORES_PER_GPU) -> list:
    """One step of ``model`` with each configuration of :data:`OFFLOAD_CONFIGS` on each machine (GPU, count), projected
    by :func:`.project.step` (bf16, one sample of the model's sequence length per GPU, the course's MFU and link
    efficiency), with DeepSpeedCPUAdam at the measured rate on ``host_cores`` cores per GPU."""
    size = models.size(model)
    return [project.step(size, gpu, gpus, cpu_adam_s_per_param_core=cpu_adam_s_per_param_core, host_cores=host_cores,
                         label=f"{model}, {config}", **kw)
            for gpu, gpus in machines for config, kw in OFFLOAD_CONFIGS.items()]


def offload_share(p: Projection) -> float:
    """The share of a projected step spent on offload: transfers over the host link, CPU Adam, NVMe reads and writes."""
    return sum(p.share(name) for name in OFFLOAD_TERMS)


def offload_table(projections: list[Projection]):
    """Per projection: the step and its terms in seconds, offload's share, and the model states kept on each GPU
    (activations come on top) against its memory."""
    import pandas as pd

    rows = []
    for p in projections:
        gpu = specs.gpu(p.hardware.split(" × ", 1)[1])
        secs = {t.name: t.seconds for t in p.terms}
        rows.append({"projected on": p.hardware, "configuration": p.label.split(", ", 1)[1],
                     "s/step": p.seconds, **{f"{name} s": secs.get(name, 0.0) for name in
                                             ("compute", "collectives", *OFFLOAD_TERMS)},
                     "offload's share": offload_share(p),
                     "model states on the GPU GB": p.memory["device"] / GB,
                     "off the GPU GB": (p.memory.get("host", 0.0) + p.memory.get("nvme", 0.0)) / GB,
                     "GPU memory GB": gpu.memory_bytes / GB})
    return pd.DataFrame(rows).set_index(["projected on", "configuration"]).round(3)


def sources(projections: list[Projection]) -> list[str]:
    """The published source of every GPU, link and drive of ``hardware.toml`` that the projections' rates read."""
    rated = {item.name: item.source for item in [*specs.links().values(), *specs.drives().values()]}
    seen: dict[str, str] = {}
    for p in projections:
        gpu = specs.gpu(p.hardware.split(" × ", 1)[1])
        seen[gpu.name] = gpu.source
        for t in p.terms:
            seen.update({name: source for name, source in rated.items() if t.rate_says.startswith(f"{name}:")})
    return [f"{name}: {source}" for name, source in seen.items()]


def missing(record: dict, assumptions: tuple[str, ...] = ("MFU", "link efficiency", "overlap")) -> list[str]:
    """What a recorded projection (:meth:`.project.Projection.record`) lacks for a reader to check it: a term without a
    count, a rate or the rate's source, an assumption not said. Empty: complete (the notebooks' tests require it)."""
    out = [f"assumption {a!r}" for a in assumptions if record["assumptions"].get(a) is None]
    out += [f"term {t['name']!r}: {what}" for t in record["terms"]
            for what, ok in (("count", t["count"] > 0), ("rate", t["rate"] > 0), ("source", bool(t["rate_says"])))
            if not ok]
    return out + ([] if record["terms"] else ["terms"])


# ---------------------------------------------------------------- notebook 15: the count check at toy size

MIN_CAPACITY = 4        # the MoE layer's default min_capacity (deepspeed/moe/layer.py), as notebook 15's model uses it


# sent(experts, capacity, hidden, ep, b): the bytes one rank sends to other ranks in one MoE layer's forward
AllToAllCount = Callable[[int, int, int, int, float], float]


def alltoall_agreement(sent: AllToAllCount, *record_sets: list[dict], b: int = ELEMENT_BYTES["fp32"]) -> list[dict]:
    """Notebook 15's count check: ``sent`` for each expert-parallel layout (every rank of each launch, ``ep_size`` > 1),
    with the capacity computed from the layout's tokens, experts, k and capacity factor, beside the bytes that rank
    sent in one forward as its comms logger measured them (the forward's all-to-all messages, of which a rank keeps
    its own slice). ``b``: 4, the runs are fp32."""
    rows = []
    for records in record_sets:
        for r, seen in zip(read_as(records, Layout, rank=None), views.layout_rows(records)):
            if r.ep_size == 1:
                continue
            C = views.capacity(r.tokens, r.experts, r.k, r.capacity_factor, MIN_CAPACITY)
            rows.append(counts.agreement(f"{r.world_size} ranks, {r.label}, rank {r.rank} (E {r.experts}, top-{r.k}, "
                                         f"capacity factor {r.capacity_factor:g}: C {C}, h {r.hidden}): bytes it sent "
                                         "in one forward", sent(r.experts, C, r.hidden, r.ep_size, b),
                                         seen["leave the rank per forward"]))
    return rows


# ---------------------------------------------------------------- notebook 15: the projection

MOE_MODEL = "Mixtral-8x7B shape"
MOE_GPUS = ("H100 80 GB", "A100 80 GB")
MOE_TOKENS = 4096
MOE_FACTORS = (1.0, 1.25)


def moe_step_counts(size: models.Size, tokens_per_gpu: int, capacity_factor: float, ep: int, sent: AllToAllCount,
                    b: int = ELEMENT_BYTES["bf16"]) -> dict:
    """One GPU's counts for a step through every MoE layer of ``size`` with DeepSpeed's MoE layer (notebook 15): the
    capacity C, the all-to-all bytes it sends (dispatch and combine, forward and backward, every layer) and the FLOPs of
    its experts, which run on the whole capacity buffer, empty slots included (``Experts.forward`` in
    ``deepspeed/moe/experts.py``): E·C token slots a GPU (E/ep local experts, C slots from each of ep ranks). ``sent``:
    the bytes a rank sends in one MoE layer's forward (the count :func:`alltoall_agreement` checked); backward sends
    as much again."""
    C = views.capacity(tokens_per_gpu, size.experts, size.top_k, capacity_factor, MIN_CAPACITY)
    one_expert = size.expert_params / (size.layers * size.experts)
    flops = counts.step_flops(size.layers * 2 * one_expert * size.experts * C)
    return {"capacity": C, "one expert": one_expert, "sent": 2 * size.layers * sent(size.experts, C, size.hidden, ep, b),
            "expert flops": flops}


def moe_projections(sent: AllToAllCount, model: str = MOE_MODEL, gpus: tuple = MOE_GPUS, tokens_per_gpu: int = MOE_TOKENS,
                    factors: tuple = MOE_FACTORS, ep: int = 8, mfu: float = project.MFU,
                    efficiency: float = project.LINK_EFFICIENCY) -> list[Projection]:
    """The MoE layers of ``model`` with ``ep`` GPUs per expert-parallel group: the experts' compute against the
    all-to-alls, over NVLink (the group in one machine) and over InfiniBand (each GPU of the group in another machine),
    for each GPU and capacity factor. The all-to-alls do not overlap the experts: the experts wait for the dispatch,
    the layer's output for the combine (``MOELayer.forward`` in ``deepspeed/moe/sharded_moe.py``). ``sent``: as for
    :func:`moe_step_counts`."""
    size = models.size(model)
    out = []
    for name in gpus:
        gpu = specs.gpu(name)
        for f in factors:
            c = moe_step_counts(size, tokens_per_gpu, f, ep, sent)
            for link, where in ((gpu.gpu_link, "the group in one machine"),
                                (specs.network(), "each GPU of the group in another machine")):
                terms = [project.compute_term(c["expert flops"], gpu, mfu),
                         project.link_term("all-to-all", c["sent"], link, efficiency)]
                assumptions = {"MFU": mfu, "link efficiency": efficiency, "tokens per GPU": tokens_per_gpu,
                               "capacity factor": f, "capacity C": c["capacity"], "ep": ep, "MoE layers": size.layers,
                               "bytes per element": ELEMENT_BYTES["bf16"], "link": link.name, "placement": where,
                               "overlap": "none: the experts wait for the dispatch, the layer's output for the combine"}
                out.append(Projection(f"{model}: experts of {size.layers} MoE layers, ep {ep}, capacity factor {f:g}, "
                                      f"over {link.name}", f"{ep} × {gpu.name}", terms, assumptions))
    return out


def moe_table(projections: list[Projection]):
    """Per projection: the all-to-all bytes and seconds per GPU and step, the experts' compute seconds, and the
    all-to-all's share of the two."""
    import pandas as pd

    rows = []
    for p in projections:
        a2a = next(t for t in p.terms if t.name == "all-to-all")
        compute = next(t for t in p.terms if t.name == "compute")
        rows.append({"projected on": p.hardware, "capacity factor": p.assumptions["capacity factor"],
                     "link": p.assumptions["link"],
                     "all-to-all GB per GPU": a2a.count / GB, "all-to-all s": a2a.seconds,
                     "expert compute s": compute.seconds, "all-to-all's share": a2a.seconds / p.seconds})
    return pd.DataFrame(rows).set_index(["projected on", "capacity factor", "link"]).round(3)
