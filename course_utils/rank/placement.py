"""Where a DeepSpeed engine placed each model state, measured from its own flags and structures: the accounting of
notebook 04's ladder (``scripts/04_offload_ladder.py``) and notebook 16's sizes (:mod:`course_utils.rank.bigger`).

:func:`host_side_storages` reads which storages DeepSpeed put in host memory (offloaded optimizer states, parameter
shards, the NVMe swappers' page-locked buffers); :func:`holdings` sums an inventory
(:func:`course_utils.rank.memory.tensor_inventory`) by state, structure, device and side; :func:`make_rung` turns
one configuration's measurements into the ``Rung`` record the notebooks read.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

import torch

from course_utils.common.records.offload import Holding, Rung


MODEL_STATES = ("params", "grads", "optimizer")


def structure_name(path: str, engine_optimizer: str, inner_optimizer: str | None) -> str:
    """The structure a tensor was found under (:func:`tensor_inventory`'s path), without its indices:
    ``optimizer.optimizer.state[<param>]['exp_avg']`` → ``DeepSpeedCPUAdam.state[p]['exp_avg']``,
    ``module.h.0.attn.c_attn.weight.ds_tensor`` → ``module parameter.ds_tensor``."""
    label = re.sub(r"\[<param>\]", "[p]", re.sub(r"\[\d+\]", "[i]", path))
    if label.startswith("module."):
        tail = next((t for t in (".ds_tensor.grad", ".ds_tensor", ".grad") if label.endswith(t)), "")
        return "module parameter" + tail
    if inner_optimizer and label.startswith("optimizer.optimizer."):
        return inner_optimizer + label[len("optimizer.optimizer"):]
    return engine_optimizer + label[len("optimizer"):] if label.startswith("optimizer.") else label


def host_side_storages(engine) -> set[int]:
    """The storages DeepSpeed itself put in host memory, found through its own flags and structures (so it holds
    on a CPU-only machine too, where every tensor's device is "cpu"): with ``offload_optimizer`` the fp32
    partitions, their gradients and the optimizer's state (stage_1_and_2.py: ``cpu_offload`` → ``self.device =
    'cpu'``, with the buffers it allocates there; stage3.py: ``offload_optimizer`` → ``subgroup_to_device[i] =
    'cpu'``, ``grad_partitions_flat_buffer`` on ``self.device``); with ``offload_param`` every parameter's shard
    (``ds_tensor``); with NVMe offload the swappers' page-locked staging buffers."""
    opt = engine.optimizer
    found = []
    to_host = getattr(opt, "subgroup_to_device", {})
    if getattr(opt, "cpu_offload", False):                               # stages 1 and 2
        found += [(p, p.grad) for p in opt.single_partition_of_fp32_groups]
        found += [(opt.temp_grad_buffer_for_cpu_offload, *opt.param_buffer_of_bit16_for_cpu_offload_groups,
                   *opt.accumulated_grads_in_cpu.values())]
    elif getattr(opt, "offload_optimizer", False):                       # stage 3
        found += [(p, p.grad) for i, p in enumerate(opt.fp32_partitioned_groups_flat) if to_host.get(i) == "cpu"]
        found.append((getattr(opt, "grad_partitions_flat_buffer", None),))
    if found:
        found += [tuple(state.values()) for state in opt.optimizer.state.values()]
    if getattr(opt, "offload_param", False):
        found += [(getattr(p, "ds_tensor", None),) for p in engine.module.parameters()]
    params, manager = swappers(engine)                 # NVMe: the swappers' page-locked buffers are host memory
    found.append(((params.buffers,) if params is not None else ()) + tuple(manager.all_buffers if manager else ()))
    return {t.untyped_storage().data_ptr() for group in found for t in group
            if isinstance(t, torch.Tensor) and t.numel()}


def swappers(engine) -> tuple:
    """NVMe offload: (the parameters' swapper, the optimizer swapper's buffer manager), None where the engine has none."""
    params = next((p.nvme_swapper for p in engine.module.parameters() if getattr(p, "nvme_swapper", None)), None)
    return params, getattr(getattr(engine.optimizer, "optimizer_swapper", None), "swap_buffer_manager", None)


def with_parameter_swapper(inventory: list, engine) -> list:
    """NVMe offload: ``inventory`` plus the parameter swapper's page-locked buffers, as DeepSpeed buffers. The engine
    holds that swapper only as each parameter's ``nvme_swapper`` attribute, which the walk of ``tensor_inventory``
    does not follow (it follows ``.grad`` and ``.ds_tensor`` off a parameter); ``host_side_storages`` already names
    its storage host side. The optimizer swapper's buffers are reached through ``engine.optimizer``."""
    params, _ = swappers(engine)
    if params is None:
        return inventory
    storage = params.buffers.untyped_storage()
    if any(e.storage == storage.data_ptr() for e in inventory):      # already found (counted once)
        return inventory
    from course_utils.rank.memory import TensorEntry

    return inventory + [TensorEntry(f"{type(params).__name__}.buffers", "buffers", str(params.buffers.dtype)
                                    .replace("torch.", ""), storage.nbytes() // params.buffers.element_size(),
                                    storage.nbytes(), str(params.buffers.device), storage.data_ptr())]


def swap_buffers(engine) -> dict | None:
    """NVMe offload: the page-locked host buffers DeepSpeed's swappers stage every read and write through,
    sized by the config, not the model (swap_tensor/partitioned_param_swapper.py: ``buffer_count`` ×
    ``buffer_size`` elements; optimizer_utils.py: ``buffer_count`` × the largest swapped tensor)."""
    params, manager = swappers(engine)
    out = {}
    if params is not None:
        out["parameter swapper"] = {"buffers": params.param_buffer_count, "elements": params.aligned_elements_per_buffer,
                                    "bytes": params.buffers.numel() * params.buffers.element_size()}
    if manager is not None:
        out["optimizer swapper"] = {"buffers": manager.count, "elements": manager.num_elems,
                                    "bytes": sum(b.numel() * b.element_size() for b in manager.all_buffers)}
    return out or None


def holdings(inventory, engine_optimizer: str, inner_optimizer: str | None,
             host_side: set[int] = frozenset()) -> list[Holding]:
    """The inventory (:func:`tensor_inventory`) summed by (state, structure, device type, side), largest first;
    ``host_side``: the storages DeepSpeed placed in host memory (:func:`host_side_storages`)."""
    rows: dict[tuple, Holding] = {}
    for e in inventory:
        module_buffer = e.category == "buffers" and e.path.startswith("module.")
        structure = "module buffer" if module_buffer else structure_name(e.path, engine_optimizer, inner_optimizer)
        side = "host" if e.storage in host_side else "accelerator"
        key = (e.category, structure, e.device.split(":")[0], side)
        row = rows.setdefault(key, Holding(e.category, structure, key[2], 0, 0, side))
        row.bytes += e.nbytes
        row.tensors += 1
    order = MODEL_STATES + ("buffers",)
    return sorted(rows.values(), key=lambda h: (order.index(h.state), -h.bytes))


def make_rung(name: str, *, rank: int, dtype: str, step_times: list[float], held: list[Holding], accelerator: str,
              accelerator_peak: int, gathered_in_forward: int, persistent_numel: int, optimizer: str, loss: float,
              swap_dir: str | None = None, phases: dict | None = None, swap_buffers: dict | None = None,
              locked: int = 0) -> Rung:
    """The ``rung`` record from one rung's measurements: the median step time; the model-state bytes by the
    device type of the tensors holding them (on a CPU-only machine the accelerator *is* the CPU: every byte is
    on it, and ``host_bytes`` is 0), by the side DeepSpeed placed them on, and in swap files on disk."""
    states = [h for h in held if h.state in MODEL_STATES]
    on_device = sum(h.bytes for h in states if h.device == accelerator)
    on_host = sum(h.bytes for h in states if h.device == "cpu") if accelerator != "cpu" else 0
    files = sorted(Path(swap_dir).rglob("*.swp")) if swap_dir is not None else None
    return Rung(name=name, rank=rank, dtype=dtype, step_seconds=statistics.median(step_times), accelerator=accelerator,
                model_state_bytes=sum(h.bytes for h in states), device_bytes=on_device, host_bytes=on_host,
                accelerator_side_bytes=sum(h.bytes for h in states if h.side == "accelerator"),
                host_side_bytes=sum(h.bytes for h in states if h.side == "host"),
                nvme_bytes=sum(f.stat().st_size for f in files or [] if f"rank{rank}" in f.parts),   # its own files
                held=list(held),
                accelerator_peak=accelerator_peak, gathered_in_forward=gathered_in_forward,
                persistent_numel=persistent_numel, optimizer=optimizer, loss=loss,
                swap_files=[str(f.relative_to(swap_dir)) for f in files] if files is not None else None,
                phases=phases, swap_buffers=swap_buffers, locked_bytes=locked)
