"""A rank that runs out of memory: the out-of-memory killer ends it, and the launch shows what that looks like.

Every rank joins the process group and takes part in one all_reduce. Then the rank ``--capped_rank`` moves itself
into the memory cgroup whose ``cgroup.procs`` file the notebook passes (``--cgroup_procs``, a limit the notebook
set) and allocates 32 MiB blocks, printing how much it holds, as a model or a batch too big for the machine would,
until the kernel kills it with SIGKILL. No Python code runs after that: no traceback, no exception, exit status -9.
The other ranks wait outside any collective, so the launcher sees the killed rank's status first and the lesson
comes out the same every run. Which rank that was, the launcher's line does not say (it shows the command of the last
rank it started): the cgroup counts its out-of-memory kills, and ``join_memory_cgroup`` leaves the runner a note of
the cgroup this rank joined. (In real training they would be waiting in a collective and fail at once with
"Connection closed by peer"; the runner then still names the rank that vanished without a traceback.)

Run from a terminal (as root, after making a cgroup):  deepspeed --num_gpus 2 scripts/05_out_of_memory.py --cgroup_procs ...
"""
import argparse
import os
import time

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common.run_folder import join_memory_cgroup
from course_utils.rank.scaffolding import finish, parse_args

BLOCK_MIB = 32


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cgroup_procs", required=True, help="cgroup.procs of a memory cgroup with a limit")
    parser.add_argument("--capped_rank", type=int, default=1)
    parser.add_argument("--max_mib", type=int, default=8192, help="stop (and fail) if this much was allocated")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    rank = dist.get_rank()
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {rank}: all_reduce gave {total.item():.0f}; pid {os.getpid()}", flush=True)
    if rank == args.capped_rank:
        join_memory_cgroup(args.cgroup_procs)     # writes this pid into cgroup.procs
        held = []
        while len(held) * BLOCK_MIB < args.max_mib:
            held.append(torch.ones(BLOCK_MIB * 2**20 // 4))     # touched, so really resident
            print(f"rank {rank}: holding {len(held) * BLOCK_MIB} MiB", flush=True)
        raise SystemExit(f"rank {rank} allocated {args.max_mib} MiB without being stopped: the limit did not apply")
    time.sleep(600)                     # the launcher ends this rank once it has seen the capped one killed
    finish()


if __name__ == "__main__":
    main()
