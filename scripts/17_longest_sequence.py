"""The longest sequence under a memory limit, at one sequence-parallel (SP) size: the world size of the launch.

Every rank puts itself under its own limit — ``--cap_mb`` MiB of tensors, counted by
``course_utils.rank.tensor_bytes`` from before the engine is built — then builds the tiny Llama under ZeRO-3, with
Ulysses attention above SP 1, and trains sequences of growing length, recording an attempt before each and its peak,
step time and loss after. An allocation past the limit raises ``torch.OutOfMemoryError``, as a GPU's allocator would;
the rank prints it in one line and ends, and the launcher ends the others. The notebook reads what was recorded before.
With ``--tiling_length`` the engine first makes one forward and backward pass at that length with and without ALST's
tiled MLP and tiled logits+loss, under the same limit; ``--kernel math`` makes attention use torch's math kernel.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/17_longest_sequence.py --cap_mb 130 --kernel math
"""
import argparse

import deepspeed
import torch.distributed as dist

from course_utils.common.record import record
from course_utils.common.records.long_context_memory import CAP_MB, KERNEL, KERNELS, LENGTHS, STEPS
from course_utils.rank.engine import training_dtype
from course_utils.rank.scaffolding import finish, parse_args, rank0_print
from course_utils.rank.sequence_memory import count_limit, engine_for, grow, tiling_comparison


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="tried in this order")
    parser.add_argument("--cap_mb", type=int, default=CAP_MB, help="each rank's limit of tensors, MiB")
    parser.add_argument("--steps", type=int, default=STEPS, help="optimizer steps per length")
    parser.add_argument("--tiling_length", type=int, default=0, help="compare tiled and plain passes at this length")
    parser.add_argument("--kernel", default=KERNEL, choices=KERNELS, help="the attention kernel")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()

    sp = dist.get_world_size()
    limit, meter = count_limit(args.cap_mb)
    with meter.counter:
        engine = engine_for(sp, training_dtype())
        rank0_print(f"SP {sp}: each rank under a limit of {args.cap_mb} MiB of tensors")
        if args.tiling_length:
            comparison = tiling_comparison(engine, sp, args.tiling_length, meter)
            record(comparison)
            rank0_print(f"one pass of {args.tiling_length} tokens: " + ", ".join(
                f"{name} {peak / 2**20:.0f} MiB" for name, peak in comparison.peaks.items()))
        grow(engine, sp, args.lengths, args.steps, meter, limit.cap_bytes, args.kernel)
    finish()


if __name__ == "__main__":
    main()
