"""First launch: every rank says who it is, then all ranks add up their numbers with one all_reduce.

Run from a terminal:  deepspeed --num_gpus 2 scripts/00_hello.py
"""
import argparse
import os
import socket
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.rank.record import Record, record
from course_utils.rank.scaffolding import finish, parse_args


@dataclass
class RankInfo(Record, name="rank_info"):
    """Who a rank is once it has joined the process group."""
    rank: int
    local_rank: int
    world_size: int
    pid: int
    backend: str
    device: str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail_rank", type=int, default=None, help="this rank raises before the all_reduce")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()          # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT set by the launcher
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = get_accelerator().device_name(local_rank)   # "cpu", or "cuda:<local_rank>" on a GPU machine

    print(f"hello from rank {rank} of {world_size} (local_rank {local_rank}, host {socket.gethostname()}, "
          f"pid {os.getpid()}, device {device}, backend {dist.get_backend()})")

    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose (--fail_rank {rank}), while the others wait in all_reduce")

    contribution = torch.tensor([float(rank + 1)], device=device)
    total = contribution.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)          # every rank ends with the same sum
    print(f"rank {rank}: contributed {contribution.item():.0f}, all_reduce(SUM) gives {total.item():.0f}")

    record(RankInfo(rank=rank, local_rank=local_rank, world_size=world_size, pid=os.getpid(),
                    backend=dist.get_backend(), device=device))
    record("all_reduce_sum", total.item())
    record("accelerator", get_accelerator().device_name())
    finish()


if __name__ == "__main__":
    main()
