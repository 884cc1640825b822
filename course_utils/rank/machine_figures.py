"""Measure what a step-time model needs of this machine, on the rank's own cores: a matmul's FLOP/s, a host memory
copy's bandwidth, DeepSpeedCPUAdam's seconds per parameter (the CPU half of ZeRO-Offload is this elementwise step),
and the disk's read and write bandwidth through DeepSpeed's ``async_io`` op with ``O_DIRECT`` (as NVMe offload uses
it). Each is the best of a few repeats after a warm-up: a rate the hardware reaches, not an average of interruptions."""
from __future__ import annotations

import os
import time
from pathlib import Path

REPEATS = 3


def best_seconds(fn, repeats: int = REPEATS) -> float:
    fn()                                    # warm-up: first-touch page faults, thread pools, op loading
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def copy_bytes_s(nbytes: int) -> float:
    """Bytes moved per second by ``dst.copy_(src)`` (each byte read once and written once: 2 × the tensor)."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_seconds(lambda: dst.copy_(src))


def cpu_adam_s_per_param(params: int) -> float:
    """DeepSpeedCPUAdam's step over one flat fp32 parameter of ``params`` elements with a gradient."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.zeros(params))
    p.grad = torch.full_like(p, 1e-3)
    optimizer = DeepSpeedCPUAdam([p], lr=1e-4)
    return best_seconds(optimizer.step) / params


def disk_bytes_s(folder: Path, nbytes: int) -> tuple[float, float]:
    """(write, read) bytes per second of one file of ``nbytes`` through DeepSpeed's ``async_io`` handle, as NVMe
    offload's swappers write and read their swap files; the file is removed after."""
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    handle = AsyncIOBuilder().load().aio_handle(block_size=1 << 20, queue_depth=32, single_submit=False,
                                                overlap_events=True, intra_op_parallelism=1)
    buffer = handle.new_cpu_locked_tensor(nbytes // 4, torch.empty(0, dtype=torch.float32))
    buffer.fill_(1.0)
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / f"probe-{os.getpid()}.swp")
    try:
        write = best_seconds(lambda: handle.sync_pwrite(buffer, path))
        read = best_seconds(lambda: handle.sync_pread(buffer, path))
    finally:
        Path(path).unlink(missing_ok=True)
        handle.free_cpu_locked_tensor(buffer)
    return nbytes / write, nbytes / read
