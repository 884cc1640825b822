"""This machine's figures for notebook 16's projections: one rank measures a matmul, a memory copy, DeepSpeedCPUAdam's
step and the disk through DeepSpeed's async_io op, and records them (``MachineFigures``).

Run from a terminal:  deepspeed --num_gpus 1 scripts/16_this_machine.py --swap_dir build/nvme/16_machine
"""
import argparse
import shutil
import time
from pathlib import Path

import torch

from course_utils.common.record import record
from course_utils.common.records.scale import MachineFigures
from course_utils.rank import machine_figures as measure
from course_utils.rank.perf import busy_seconds, matmul_flops_per_s
from course_utils.rank.scaffolding import finish, parse_args, rank0_print


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--swap_dir", required=True, help="a folder on the disk NVMe offload would use")
    parser.add_argument("--copy_mb", type=int, default=256)
    parser.add_argument("--adam_params", type=int, default=16_000_000)
    parser.add_argument("--disk_mb", type=int, default=256)
    parser.add_argument("--matmul_n", type=int, default=1024)
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    MB = 2**20
    began, own = (time.perf_counter(), time.process_time()), busy_seconds()
    matmul = matmul_flops_per_s("cpu", n=args.matmul_n)
    copy = measure.copy_bytes_s(args.copy_mb * MB)
    adam = measure.cpu_adam_s_per_param(args.adam_params)
    try:
        write, read = measure.disk_bytes_s(Path(args.swap_dir), args.disk_mb * MB)
    finally:
        shutil.rmtree(args.swap_dir, ignore_errors=True)
    wall = time.perf_counter() - began[0]
    others = max(0.0, busy_seconds() - own - (time.process_time() - began[1])) / wall
    figures = MachineFigures(torch.get_num_threads(), matmul, args.matmul_n, copy, args.copy_mb * MB, adam,
                             args.adam_params, write, read, args.disk_mb * MB, others)
    record(figures)
    rank0_print(f"matmul {matmul / 1e9:.1f} GFLOP/s, copy {copy / 1e9:.1f} GB/s, DeepSpeedCPUAdam {adam * 1e9:.2f} ns a "
                f"parameter on {figures.threads} threads, disk write {write / 1e9:.2f} GB/s, read {read / 1e9:.2f} GB/s")
    finish()


if __name__ == "__main__":
    main()
