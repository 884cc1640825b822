"""Bigger than your device: one rank under a memory limit trains models of growing size, one configuration per
launch, until the limit stops it.

The rank imports torch, DeepSpeed and transformers and loads DeepSpeed's ops first, then puts itself under the
limit (``course_utils.rank.bigger.apply_limit``: on a GPU the CUDA allocator is capped, on a CPU the rank joins the
memory cgroup the notebook made), and only then builds models: the limit counts what training allocates. For each
size it records an attempt, trains a few real optimizer steps, records where the model states were, and frees
everything. A size too big for the limit ends the rank: SIGKILL from the kernel's out-of-memory killer on a CPU,
``torch.OutOfMemoryError`` on a GPU; the notebook reads what was recorded before. With ``--machine_swap_dir`` the
rank first measures this machine's rates (``course_utils.rank.machine_figures``), before it joins the limit.

Run from a terminal (as root, after making a cgroup):
  deepspeed --num_gpus 1 scripts/16_bigger_than_your_device.py --configuration "no ZeRO" --cap_mb 256 --cgroup_procs ...
"""
import argparse
from pathlib import Path

import deepspeed
import torch.distributed as dist

from course_utils.common.record import record
from course_utils.common.records.bigger import CONFIGURATIONS, SIZES
from course_utils.rank import machine_figures
from course_utils.rank.bigger import (apply_limit, charged, limit_peak, load_ops, return_freed_memory, start_peak,
                                     train_size, trim_freed_memory)
from course_utils.rank.engine import training_dtype
from course_utils.rank.scaffolding import finish, load_exercise, parse_args, rank0_print


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configuration", default="no ZeRO", choices=list(CONFIGURATIONS))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), help="tried in this order")
    parser.add_argument("--cap_mb", type=int, default=352, help="the limit, MiB")
    parser.add_argument("--cgroup_procs", default=None, help="CPU: cgroup.procs of a memory cgroup with that limit")
    parser.add_argument("--nvme_dir", default=None, help="folder for the swap files of the NVMe configuration")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per size")
    parser.add_argument("--nvme_keys_file", default=None,
                        help="a file defining nvme_keys(folder, largest_param): the NVMe keys to run (notebook 16's "
                        "exercise); without it, DeepSpeed's defaults beside the device and the folder")
    parser.add_argument("--machine_swap_dir", default=None,
                        help="measure this machine's rates first, outside the limit (notebook 16's section 5), with "
                        "the disk's probe file in this folder (removed after)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    dtype = training_dtype()
    load_ops(args.configuration)
    folder = str(Path(args.nvme_dir) / f"rank{dist.get_rank()}") if args.nvme_dir else None
    nvme = load_exercise(args.nvme_keys_file, ["nvme_keys"])["nvme_keys"] if args.nvme_keys_file else None
    if args.machine_swap_dir:      # outside the limit, its freed blocks given back after: not the training's
        return_freed_memory()
        figures = machine_figures.measure_here(Path(args.machine_swap_dir))
        trim_freed_memory()
        record(figures)
        rank0_print(f"this machine: {machine_figures.said(figures)}")
    limit = apply_limit(args.cap_mb * 2**20, args.cgroup_procs)
    record(limit)
    rank0_print(f"{args.configuration}: under a {limit.kind} limit of {args.cap_mb} MiB")
    for size in args.sizes:
        start_peak(limit, args.cgroup_procs)
        before = charged(args.cgroup_procs) if limit.kind == "cgroup" else 0
        trial = train_size(args.configuration, size, args.steps, dtype, nvme_folder=folder, nvme=nvme)
        trial.extra["held_before"] = before
        trial.peak_bytes, trial.limit_bytes = limit_peak(limit, args.cgroup_procs), limit.cap_bytes
        record(trial)
        rank0_print(f"{size:>5}: {trial.params / 1e6:5.1f} M parameters trained, loss {trial.losses[0]:.2f} → "
                    f"{trial.losses[-1]:.2f}, {trial.step_seconds:.2f} s/step, peak {trial.peak_bytes / 2**20:.0f} MiB")
    finish()


if __name__ == "__main__":
    main()
