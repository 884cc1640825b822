"""Inside the rank of notebook 16: a memory limit the learner set, and models of growing size trained under it.

**The limit, decided in one place** (:func:`limit_kind`, from the rank's own device):

- on a GPU, the CUDA caching allocator is capped (``torch.cuda.set_per_process_memory_fraction``): what the rank
  allocates on its device counts, the CUDA context and the libraries do not; past the cap ``torch.OutOfMemoryError``;
- on a CPU, the rank writes its pid into a memory cgroup the notebook made (``launch.memcap``) *after* importing
  torch, DeepSpeed and transformers and loading DeepSpeed's ops, right before it builds a model. The kernel charges
  memory to the cgroup the process is in when it allocates, and does not move earlier charges when a process joins
  another one (cgroup v2; v1 likewise unless ``memory.move_charge_at_immigrate`` is set): the limit counts what the
  rank allocates from then on (models, gradients, optimizer states, activations, DeepSpeed's buffers), not the
  interpreter and the libraries. Past the limit the kernel's out-of-memory killer ends the rank with SIGKILL.

Each size is built (under ``deepspeed.zero.Init`` at stage 3, so it is partitioned, and offloaded, as it is
created), trained for a few real optimizer steps on one fixed batch (so the loss falls), measured as notebook 04
measures its ladder (the same functions, :mod:`course_utils.rank.placement`: every tensor the engine holds, the side
DeepSpeed placed it on, the swap files), then freed before the next one.
"""
from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Callable

from course_utils.common import run_folder
from course_utils.rank.perf import busy_seconds     # imported with psutil before the rank joins its limit
from course_utils.common.records.bigger import (CONFIGURATIONS, HEADS, LR, MICRO_BATCH, POSITIONS, SEQ_LEN, SIZES,
    VOCAB, Attempt, Limit, Trial, zero_keys)


# ---------------------------------------------------------------- the limit

def limit_kind(device: str, cgroup_procs: str | None) -> str:
    """How a rank on ``device`` ("cpu" | "cuda") is limited: ``"cuda"`` (its allocator capped), ``"cgroup"`` (it
    joins the memory cgroup whose ``cgroup.procs`` the notebook passed) or ``"none"`` (a CPU rank without one)."""
    if device == "cuda":
        return "cuda"
    return "cgroup" if cgroup_procs else "none"


def cuda_fraction(cap_bytes: int, device_total: int) -> float:
    """The fraction of a device's memory that is ``cap_bytes`` (what ``set_per_process_memory_fraction`` takes)."""
    if not 0 < cap_bytes <= device_total:
        raise ValueError(f"a cap of {cap_bytes / 2**20:.0f} MiB does not fit a device of {device_total / 2**20:.0f} "
                         "MiB: choose a smaller CAP_MB")
    return cap_bytes / device_total


def cgroup_file(procs_file: str | Path, v2: str, v1: str) -> Path:
    """A file of the cgroup of ``procs_file`` by its cgroup v2 name, or its v1 name on a v1 hierarchy."""
    folder = Path(procs_file).parent
    return folder / v2 if (folder / v2).exists() else folder / v1


def charged(procs_file: str | Path) -> int:
    """Bytes charged to the cgroup now (v2 ``memory.current``, v1 ``memory.usage_in_bytes``)."""
    return int(cgroup_file(procs_file, "memory.current", "memory.usage_in_bytes").read_text())


def reset_peak(procs_file: str | Path) -> None:
    """Start a new peak (v1: write 0 to ``memory.max_usage_in_bytes``; v2: ``memory.peak`` is reset by a write on
    kernels from 6.12, older ones keep the cgroup's lifetime peak)."""
    try:
        cgroup_file(procs_file, "memory.peak", "memory.max_usage_in_bytes").write_text("0")
    except OSError:
        pass


def peak(procs_file: str | Path) -> int:
    """The most the cgroup counted since :func:`reset_peak` (0 where the kernel keeps no peak)."""
    path = cgroup_file(procs_file, "memory.peak", "memory.max_usage_in_bytes")
    return int(path.read_text()) if path.exists() else 0


def load_ops(configuration: str) -> None:
    """Load the DeepSpeed ops this configuration's engine uses before the rank joins its limit: their shared
    libraries belong to the host side, like torch's."""
    from deepspeed.accelerator import get_accelerator
    from transformers import GPT2LMHeadModel  # noqa: F401  (transformers imports its model code on first use)

    _, keys = CONFIGURATIONS[configuration]
    devices = {keys.get(k, {}).get("device") for k in ("offload_optimizer", "offload_param")}
    if devices & {"cpu", "nvme"}:
        get_accelerator().create_op_builder("CPUAdamBuilder").load()
    if "nvme" in devices:
        get_accelerator().create_op_builder("AsyncIOBuilder").load()


def return_freed_memory() -> None:
    """Have glibc give every large block back to the kernel when it is freed (``mallopt(M_MMAP_THRESHOLD, 64 KiB)``).
    By default the threshold grows after a large block is freed (up to 32 MiB), and later tensors below it come from
    the heap, which keeps freed memory for reuse: bytes that no tensor holds any more would still count against the
    limit. A CUDA allocator's cache is not counted by its cap's own measure either."""
    import ctypes

    M_MMAP_THRESHOLD = -3
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 64 * 1024)


def trim_freed_memory() -> None:
    """Give the heap's free pages back to the kernel (``malloc_trim(0)``). Memory a rank used before it joined its
    memory cgroup stays charged outside the cgroup: pages of it that later allocations reused would escape the limit
    (a rank that measured this machine first peaked 17 MiB lower at the same size without this, 3 MiB with it)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def apply_limit(cap_bytes: int, cgroup_procs: str | None) -> Limit:
    """Put this rank under its limit (:func:`limit_kind` decides which); returns what applied."""
    from deepspeed.accelerator import get_accelerator

    device = get_accelerator().device_name()
    kind = limit_kind(device, cgroup_procs)
    if kind == "cuda":
        import torch

        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        fraction = cuda_fraction(cap_bytes, total)
        torch.cuda.set_per_process_memory_fraction(fraction)
        return Limit("cuda", cap_bytes, device, fraction=fraction, device_total=total)
    if kind == "cgroup":
        return_freed_memory()
        run_folder.join_memory_cgroup(cgroup_procs)
        return Limit("cgroup", cap_bytes, device, charged_after_join=charged(cgroup_procs))
    return Limit("none", cap_bytes, device, why="no memory cgroup was given to this CPU rank")


def limit_peak(limit: Limit, cgroup_procs: str | None) -> int:
    """The most the limit counted for the size just trained: the cgroup's peak on a CPU; on a GPU the peak of what the
    capped allocator reserved, not of what tensors held (``set_per_process_memory_fraction`` bounds the segments the
    caching allocator takes with cudaMalloc, ``c10/cuda/CUDACachingAllocator.cpp``: a size fails when its reserved
    memory, fragmentation included, would pass the limit)."""
    from course_utils.rank.engine import accelerator_bytes

    if limit.kind == "cgroup":
        return peak(cgroup_procs)
    return accelerator_bytes()["reserved_peak"] if limit.kind == "cuda" else 0


def start_peak(limit: Limit, cgroup_procs: str | None) -> None:
    from course_utils.rank.engine import reset_accelerator_peak

    if limit.kind == "cgroup":
        reset_peak(cgroup_procs)
    elif limit.kind == "cuda":
        reset_accelerator_peak()


# ---------------------------------------------------------------- the models

def gpt2_config(size: str):
    """The GPT2Config of ``size`` (:data:`SIZES`), without dropout: one fixed batch, a loss that falls."""
    from transformers import GPT2Config

    n_embd, n_layer = SIZES[size]
    return GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=n_embd, n_layer=n_layer, n_head=HEADS,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def build(size: str, config: dict):
    """A GPT-2 of ``size`` with GPT-2's initial weights. At stage 3 transformers builds it inside ``zero.Init``
    (a live ``HfDeepSpeedConfig`` tells it to: ``PreTrainedModel._from_config``), so each layer is partitioned,
    and put where ``offload_param`` says, as it is made, and initialised gathered layer by layer: the whole model
    never exists in one place. Returns (model, the HfDeepSpeedConfig to keep alive while it trains)."""
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.integrations import HfDeepSpeedConfig

    torch.manual_seed(0)
    keep_alive = HfDeepSpeedConfig(config) if config["zero_optimization"]["stage"] == 3 else None
    model = GPT2LMHeadModel._from_config(gpt2_config(size))
    model.loss_type = "ForCausalLM"     # GPT-2 names no loss type, and transformers warns before taking this default
    return model, keep_alive


def numel(p) -> int:
    """A parameter's elements, also when stage 3 has partitioned it."""
    return getattr(p, "ds_numel", None) or p.numel()


def sizes_of(model) -> tuple[int, int]:
    """(parameters, the largest module's own parameters) as DeepSpeed's stage-3 estimator counts them."""
    total = sum(numel(p) for p in model.parameters())
    largest = max(sum(numel(p) for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


# ---------------------------------------------------------------- one size

def train_size(configuration: str, size: str, steps: int, dtype: str, nvme_folder: str | None = None,
               nvme: Callable[[str, int], dict] | None = None) -> Trial:
    """Build ``size`` under ``configuration`` (its NVMe keys from ``nvme``, else DeepSpeed's defaults), take ``steps`` optimizer steps on one fixed
    batch, measure where the model states are after the last backward (notebook 04's walk), free it all; returns the
    trial."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator
    from transformers import GPT2LMHeadModel

    from course_utils.common.record import record
    from course_utils.rank.engine import ds_config, free_memory
    from course_utils.rank.memory import tensor_inventory
    from course_utils.rank.placement import (holdings, host_side_storages, make_rung, swap_buffers,
        with_parameter_swapper)

    with torch.device("meta"):        # counted without memory: the attempt is on record before anything is built
        meta = GPT2LMHeadModel(gpt2_config(size))
    params, largest = sizes_of(meta)
    record(Attempt(configuration, size, params, largest))
    stage, keys = zero_keys(configuration, nvme_folder, max(p.numel() for p in meta.parameters()), nvme)
    config = ds_config(stage, dtype, micro_batch=MICRO_BATCH, **keys)
    config["optimizer"]["params"]["lr"] = LR
    model, keep_alive = build(size, config)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ids = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(0)).to(engine.device)
    losses, times = [], []
    window = None                      # (wall, own CPU, machine's busy CPU) when the timed steps began
    for step in range(steps):
        if step == min(1, steps - 1):
            window = time.perf_counter(), time.process_time(), busy_seconds()
        started = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        if step == steps - 1:          # where the model states peak: after backward, before the step
            pause = time.perf_counter()
            inventory = with_parameter_swapper(tensor_inventory(engine), engine)
            host_side = host_side_storages(engine)
            started += time.perf_counter() - pause
        engine.step()
        times.append(time.perf_counter() - started)
        losses.append(float(loss.detach()))
    wall = time.perf_counter() - window[0]
    others = max(0.0, busy_seconds() - window[2] - (time.process_time() - window[1]))
    inner = getattr(engine.optimizer, "optimizer", None)
    held = holdings(inventory, type(engine.optimizer).__name__, type(inner).__name__ if inner is not None else None,
                    host_side)
    rung = make_rung(configuration, rank=dist.get_rank(), dtype=dtype, step_times=times[1:] or times, held=held,
                     accelerator=get_accelerator().device_name(), accelerator_peak=0, gathered_in_forward=0,
                     persistent_numel=0, optimizer=type(inner if inner is not None else engine.optimizer).__name__,
                     loss=losses[-1], swap_dir=nvme_folder, swap_buffers=swap_buffers(engine))
    rung.swap_files = None          # their bytes are in nvme_bytes; the names are notebook 04's lesson
    engine.destroy()
    del engine, model, inner, loss, keep_alive      # nothing of this size may stay charged to the limit
    free_memory()      # not all of a destroyed engine comes back (the script records what is still charged before each
    #                    size, ``held_before``), so a launch grows the model only until the first size that does not fit
    if nvme_folder:
        shutil.rmtree(nvme_folder, ignore_errors=True)       # the next size starts with no swap files
    return Trial(configuration, size, params, largest, dtype, losses, statistics.median(times[1:] or times),
                 rung=rung, extra={"others_cores": others / wall if wall > 0 else 0.0})


