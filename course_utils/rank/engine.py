"""DeepSpeed engines inside a rank: the config of an experiment, one training step, what an engine
holds (dtypes, gathered stage-3 parameters, accelerator bytes), and freeing it for the next one.

The ZeRO experiments (scripts 03-05) build one engine per stage/dtype/offload on the course GPT-2
(``models.tiny_gpt2("zero_lab")``) with random tokens as data.
"""
from __future__ import annotations

import copy
import gc
from typing import Any

from course_utils.common import paths
from course_utils.rank.models import preset
from course_utils.rank.scaffolding import read_config


def ds_config(stage: int, dtype: str = "bf16", micro_batch: int = 1, **zero: Any) -> dict:
    """The course config ``configs/zero<stage>.json`` for ``dtype`` ("fp32" | "bf16" | "fp16") with a
    small micro-batch; extra keyword arguments go into ``zero_optimization``."""
    cfg = read_config(paths.CONFIGS / f"zero{stage}.json")
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["zero_optimization"].update(copy.deepcopy(zero))
    for key in ("bf16", "fp16"):
        cfg.pop(key, None)
    if dtype in ("bf16", "fp16"):
        cfg[dtype] = {"enabled": True}
    return cfg


def nvme_offload(folder: str) -> dict:
    """zero_optimization keys for ZeRO-Infinity: optimizer states and parameters swapped to ``folder``. The course's
    own NVMe rung (notebook 04's ladder when the learner has written none, notebook 05's out-of-memory ladder); it lives
    here, outside the modules notebook 04 imports, because writing these keys is that notebook's exercise 1."""
    return {"offload_optimizer": {"device": "nvme", "nvme_path": folder, "pin_memory": False, "buffer_count": 4},
            "offload_param": {"device": "nvme", "nvme_path": folder, "pin_memory": False, "buffer_count": 5,
                              "buffer_size": 1e8}}


def training_dtype() -> str:
    """bf16 on an accelerator that supports it; fp32 on a CPU, where bf16 matrix products are emulated
    (many times slower) unless the processor has AVX512-BF16 or AMX instructions."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    return "bf16" if acc.device_name() != "cpu" and acc.is_bf16_supported() else "fp32"


def batch(engine, seed: int = 0):
    """Random token ids for one micro-batch on the engine's device (labels = inputs: next-token loss)."""
    import torch

    g = torch.Generator().manual_seed(seed + engine.global_rank)
    vocab = engine.module.config.vocab_size
    ids = torch.randint(0, vocab, (engine.train_micro_batch_size_per_gpu(), preset("zero_lab").seq_len), generator=g)
    return ids.to(engine.device)


def forward_backward(engine, step: int = 0) -> float:
    """One forward and backward pass on :func:`batch` ``step``; returns the loss (no optimizer step)."""
    ids = batch(engine, step)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    return float(loss.detach())


def _device_accelerator():
    """DeepSpeed's accelerator, or None on a CPU-only machine (no device memory of its own to read)."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    return None if acc.device_name() == "cpu" else acc


def accelerator_bytes() -> dict[str, int]:
    """Allocated / peak bytes on the accelerator (0 on a CPU-only machine): what tensors hold, and the peak of what the
    caching allocator reserved from the device (``reserved_peak``: the segments it holds, tensors or not, which is what
    a memory fraction caps and what ``nvidia-smi`` sees of the process)."""
    acc = _device_accelerator()
    if acc is None:
        return {"allocated": 0, "peak": 0, "reserved_peak": 0}
    return {"allocated": int(acc.memory_allocated()), "peak": int(acc.max_memory_allocated()),
            "reserved_peak": int(acc.max_memory_reserved())}


def reset_accelerator_peak() -> None:
    """Start a new peak for :func:`accelerator_bytes` (each engine's own peak, not the process's); no-op on a CPU."""
    acc = _device_accelerator()
    if acc is not None:
        acc.reset_peak_memory_stats()


def release(engine) -> None:
    """Drop an engine and everything it holds before the next one is built in the same process."""
    engine.destroy()
    free_memory()


def free_memory() -> None:
    """Collect what reference cycles hold, empty the accelerator's cache and hand freed heap pages back to the kernel,
    so that the next measurement (RSS, a memory limit) starts clean."""
    import ctypes

    from deepspeed.accelerator import get_accelerator

    gc.collect()
    get_accelerator().empty_cache()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def gathered_numel(module) -> int:
    """Stage 3: elements of the parameters currently gathered whole (not counting persistent ones)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(p.ds_numel for p in module.parameters()
               if getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE and not getattr(p, "ds_persist", False))


def dtype_name(dtype) -> str | None:
    """``torch.bfloat16`` → ``"bfloat16"`` (JSON-friendly)."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def engine_dtypes(engine: Any) -> dict[str, str | None]:
    """The dtypes a ZeRO stage 1/2 engine really holds, read after a backward pass.

    - ``module``: the parameters the forward pass uses (what the model was cast to);
    - ``master``: the optimizer's own copy of this rank's partition (``single_partition_of_fp32_groups``);
    - ``grad``: the gradient the engine reduces (``param.grad`` before the step, or the optimizer's
      partitioned gradient buffer when the engine already moved it there);
    - ``communication``: the dtype gradients are all-reduced in.
    """
    param = next(p for p in engine.module.parameters() if p.requires_grad)
    opt = engine.optimizer
    master = getattr(opt, "single_partition_of_fp32_groups", None)
    grad = param.grad
    if grad is None and getattr(opt, "averaged_gradients", None):
        grad = next(iter(opt.averaged_gradients.values()))[0]
    return {"module": dtype_name(param.dtype),
            "master": dtype_name(master[0].dtype) if master else None,
            "grad": dtype_name(grad.dtype) if grad is not None else None,
            "communication": dtype_name(engine.communication_data_type)}


def scaler_for(fp16: dict):
    """DeepSpeed's own scaler for an "fp16" config section: the section read by DeepSpeed's config class
    (``get_float16_config``: ``"false"`` is False there, a missing key its default), the scaler made from what it read
    as the ZeRO optimizers make theirs (``CreateLossScaler``): dynamic when ``loss_scale`` is 0, else static."""
    import torch
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from deepspeed.runtime.precision_config import get_float16_config

    read = get_float16_config({"fp16": {"enabled": True, **fp16}})
    return CreateLossScaler(dtype=torch.half, static_loss_scale=read.loss_scale, dynamic_scaling=read.loss_scale == 0,
                            dynamic_loss_args=read.dynamic_loss_scale_args())
