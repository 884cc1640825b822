"""Every rank reports who it is, runs every collective once, and (optionally) times all_reduce and
records which collectives ZeRO stages call in one training step.

Run from a terminal:  deepspeed --num_gpus 2 scripts/01_collectives.py --sizes 1024 1048576 --zero_stages 2 3
"""
import argparse
import time

import deepspeed
import psutil
import torch.distributed as dist

from course_utils.common.records.collectives import AllReduceTime, CollectiveRow, TimingLoad, ZeroCollectives
from course_utils.rank.distributed import (backends_available, choose_device, rank_identity, run_collectives,
    time_all_reduce, zero_step_collectives)
from course_utils.common.record import record
from course_utils.rank.perf import busy_seconds
from course_utils.rank.scaffolding import finish, parse_args


MIN_LOAD_WINDOW_S = 0.5      # a shorter timing is watched that long, idle, so that the machine's counters mean something


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[], help="all_reduce message sizes (float32 elements) to time")
    parser.add_argument("--repeats", type=int, default=5, help="timed all_reduce calls per size (the median is kept)")
    parser.add_argument("--zero_stages", type=int, nargs="*", default=[], choices=[1, 2, 3],
                        help="ZeRO stages whose collectives in one training step to record (DeepSpeed's comms logger)")
    parser.add_argument("--cpu", action="store_true", help="CPU tensors over gloo even on a GPU machine "
                        "(for nodes simulated on one machine, whose ranks would share GPUs)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    identity = rank_identity()
    device, backend = choose_device(identity.local_rank, identity.local_size, cpu=args.cpu)
    deepspeed.init_distributed(dist_backend=backend)   # joins via MASTER_ADDR:MASTER_PORT, as RANK of WORLD_SIZE
    identity.backend, identity.device = dist.get_backend(), device
    print(f"node_rank {identity.node_rank} local_rank {identity.local_rank} → rank {identity.rank} of "
          f"{identity.world_size} (master {identity.master_addr}:{identity.master_port}, {backend}, {device})")
    record(identity)
    record("backends", backends_available())

    record(CollectiveRow.NAME, run_collectives(device))

    if args.sizes:
        wall, own, busy = time.perf_counter(), time.process_time(), busy_seconds()
        record(AllReduceTime.NAME, time_all_reduce(args.sizes, device, repeats=args.repeats))
        time.sleep(max(0.0, MIN_LOAD_WINDOW_S - (time.perf_counter() - wall)))   # CPU counters tick every 10 ms
        record(TimingLoad(rank=dist.get_rank(), wall_s=time.perf_counter() - wall, own_cpu_s=time.process_time() - own,
                          machine_busy_s=busy_seconds() - busy, cores=psutil.cpu_count() or 1))
    for stage in args.zero_stages:
        record(ZeroCollectives.NAME, zero_step_collectives(stage, device))
    finish()


if __name__ == "__main__":
    main()
