"""This machine's figures for notebook 16's projections: one rank measures a matmul, a memory copy, DeepSpeedCPUAdam's
step and the disk through DeepSpeed's async_io op, and records them (``MachineFigures``).

Run from a terminal:  deepspeed --num_gpus 1 scripts/16_this_machine.py --swap_dir build/nvme/16_machine
"""
import argparse
from pathlib import Path

from course_utils.common.record import record
from course_utils.rank import machine_figures as measure
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
    figures = measure.measure_here(Path(args.swap_dir), args.copy_mb, args.adam_params, args.disk_mb, args.matmul_n)
    record(figures)
    rank0_print(measure.said(figures))
    finish()


if __name__ == "__main__":
    main()
