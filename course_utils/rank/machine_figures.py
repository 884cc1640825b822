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


def measure_here(swap_dir: Path, copy_mb: int = 256, adam_params: int = 16_000_000, disk_mb: int = 256,
                 matmul_n: int = 1024):
    """All four on this rank, one after the other, and what other programs took meanwhile: a ``MachineFigures``.
    The disk's probe file goes under ``swap_dir``, which is removed after. The sizes are those of a smoke run too:
    smaller copies and Adam steps would fit in the processor's caches and measure those instead of memory (2 M
    parameters of Adam ran 14 × faster per parameter than 16 M here)."""
    import shutil

    import torch

    from course_utils.common.records.scale import MachineFigures
    from course_utils.rank.perf import busy_seconds, matmul_flops_per_s

    MB = 2**20
    began, own = (time.perf_counter(), time.process_time()), busy_seconds()
    matmul = matmul_flops_per_s("cpu", n=matmul_n)
    copy = copy_bytes_s(copy_mb * MB)
    adam = cpu_adam_s_per_param(adam_params)
    try:
        write, read = disk_bytes_s(Path(swap_dir), disk_mb * MB)
    finally:
        shutil.rmtree(swap_dir, ignore_errors=True)
    wall = time.perf_counter() - began[0]
    others = max(0.0, busy_seconds() - own - (time.process_time() - began[1])) / wall
    return MachineFigures(torch.get_num_threads(), matmul, matmul_n, copy, copy_mb * MB, adam, adam_params, write,
                          read, disk_mb * MB, others)


def said(figures) -> str:
    """The figures in one line, as a rank prints them."""
    return (f"matmul {figures.matmul_flops_s / 1e9:.1f} GFLOP/s, copy {figures.copy_bytes_s / 1e9:.1f} GB/s, "
            f"DeepSpeedCPUAdam {figures.cpu_adam_s_per_param * 1e9:.2f} ns a parameter on {figures.threads} threads, "
            f"disk write {figures.disk_write_bytes_s / 1e9:.2f} GB/s, read {figures.disk_read_bytes_s / 1e9:.2f} GB/s")
