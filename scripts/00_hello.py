"""First launch: every rank says who it is, then all ranks add up their numbers with one all_reduce.
With the notebook's exercise files it also runs the learner's ``roll_call()`` (every rank learns every
rank's pid) or ``prepare_then_read()`` (rank 0 prepares a file that every rank reads) in every rank.

Run from a terminal:  deepspeed --num_gpus 2 scripts/00_hello.py
"""
import argparse
import os
import socket
import time

import deepspeed
import psutil
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.common import run_folder
from course_utils.common.record import record
from course_utils.common.records.hello import Prepared, RankInfo, RollCall
from course_utils.rank.scaffolding import finish, load_exercise, parse_args

BUILD_SECONDS = 1.5          # how long "building the vocabulary" takes on rank 0
VOCABULARY = "\n".join(["<pad>", "<unk>", "deep", "speed", "rank", "world", "gloo", "nccl"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roll_call_file", default=None, help="file defining roll_call() (checks.export_function)")
    parser.add_argument("--prepare_file", default=None,
                        help="file defining prepare_then_read(path, build_vocabulary) (checks.export_function)")
    return parser


def run_roll_call(path: str, rank: int) -> None:
    """Call the learner's ``roll_call()`` and record its answer beside this rank's own pid."""
    roll_call = load_exercise(path, ["roll_call"])["roll_call"]
    answer = roll_call()
    print(f"rank {rank}: roll_call() returned {answer!r}")
    items = answer if isinstance(answer, (list, tuple)) else [answer]
    record(RollCall(rank=rank, pid=os.getpid(), answer=[a if isinstance(a, int) else repr(a) for a in items]))


def run_prepare_then_read(path: str, rank: int) -> None:
    """Call the learner's ``prepare_then_read()`` on a file in this launch's own folder, with a
    ``build_vocabulary()`` that takes ``BUILD_SECONDS`` (counting how often this rank calls it)."""
    prepare_then_read = load_exercise(path, ["prepare_then_read"])["prepare_then_read"]
    builds = []

    def build_vocabulary() -> str:
        time.sleep(BUILD_SECONDS)
        builds.append(time.time())
        return VOCABULARY

    target = run_folder.here() / "vocabulary.txt"   # the same path on every rank
    start = time.perf_counter()
    text = prepare_then_read(str(target), build_vocabulary)
    seconds = time.perf_counter() - start
    words = len(text.splitlines()) if isinstance(text, str) else 0
    print(f"rank {rank}: read {words} words after {seconds:.1f} s, built the file {len(builds)} time(s)")
    record(Prepared(rank=rank, read_right=text == VOCABULARY, builds=len(builds), seconds=round(seconds, 3),
                    returned_at=time.time(), built_at=builds[-1] if builds else None))


def main(argv=None) -> None:
    imported = time.time()                # torch and DeepSpeed are imported: the module's first lines have run
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()          # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT set by the launcher
    joined = time.time()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = get_accelerator().device_name(local_rank)   # "cpu", or "cuda:<local_rank>" on a GPU machine

    print(f"hello from rank {rank} of {world_size} (local_rank {local_rank}, host {socket.gethostname()}, "
          f"pid {os.getpid()}, device {device}, backend {dist.get_backend()})")
    record(RankInfo(rank=rank, local_rank=local_rank, world_size=world_size, pid=os.getpid(),
                    backend=dist.get_backend(), device=device))

    if args.roll_call_file:
        run_roll_call(args.roll_call_file, rank)
    if args.prepare_file:
        run_prepare_then_read(args.prepare_file, rank)

    contribution = torch.tensor([float(rank + 1)], device=device)
    total = contribution.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)          # every rank ends with the same sum
    print(f"rank {rank}: contributed {contribution.item():.0f}, all_reduce(SUM) gives {total.item():.0f}")
    record("all_reduce_sum", total.item())
    record("accelerator", get_accelerator().device_name())
    # where this rank's seconds went (wall clock, comparable across the processes of one machine)
    record("timeline", {"started": psutil.Process().create_time(), "imported": imported, "joined": joined,
                        "done": time.time()})
    finish()


if __name__ == "__main__":
    main()
