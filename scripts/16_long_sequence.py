"""A long sequence under ZeRO-3 + CPU offload: model states that fit, activations that do not.

One rank under notebook 16's memory limit (``course_utils.rank.bigger.apply_limit``: a memory cgroup on a CPU, a
capped CUDA allocator on a GPU) builds one engine and trains one step per pass: a short sequence, then a long one with
transformers' activation checkpointing, then the same long one without it, DeepSpeed's ``activation_checkpointing``
config section still in the config. The last pass ends the rank (SIGKILL from the out-of-memory killer on a CPU,
``torch.OutOfMemoryError`` on a GPU); the notebook reads what was recorded before.

Run from a terminal (as root, after making a cgroup):
  deepspeed --num_gpus 1 scripts/16_long_sequence.py --cap_mb 352 --short 256 --long 2048 --cgroup_procs ...
"""
import argparse

import deepspeed

from course_utils.common.record import record
from course_utils.common.records.bigger_sequence import CONFIGURATION, passes
from course_utils.rank.bigger import apply_limit, load_ops
from course_utils.rank.bigger_sequence import engine_for, run_pass
from course_utils.rank.engine import training_dtype
from course_utils.rank.scaffolding import finish, parse_args, rank0_print


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cap_mb", type=int, default=352, help="the limit, MiB")
    parser.add_argument("--cgroup_procs", default=None, help="CPU: cgroup.procs of a memory cgroup with that limit")
    parser.add_argument("--short", type=int, default=256, help="tokens of the short sequence")
    parser.add_argument("--long", type=int, default=2048, help="tokens of the long sequence")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    dtype = training_dtype()
    load_ops(CONFIGURATION)
    limit = apply_limit(args.cap_mb * 2**20, args.cgroup_procs)
    record(limit)
    rank0_print(f"{CONFIGURATION}: under a {limit.kind} limit of {args.cap_mb} MiB")
    engine, keep_alive = engine_for(args.long, dtype)
    for name, tokens, checkpointing in passes(args.short, args.long):
        rank0_print(f"{name} ({tokens} tokens): ...")
        done = run_pass(engine, name, tokens, checkpointing, limit, args.cgroup_procs)
        rank0_print(f"{name} ({tokens} tokens): trained, loss {done.loss:.2f}, {done.seconds:.2f} s, "
                    f"peak {done.peak_bytes / 2**20:.0f} MiB")
    finish()


if __name__ == "__main__":
    main()
