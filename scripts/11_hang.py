"""A training loop that hangs: each step every rank averages its loss over the ranks for the log, but a rank whose
loss is not finite skips that all_reduce (a common "guard" against logging inf). The other rank waits in it
forever, while the rank that skipped has gone on to the end-of-epoch barrier.

With ``--log_metrics_file`` the ranks use the learner's ``log_metrics`` (notebook 11, exercise 3) instead.

Run from a terminal (it hangs: stop it with Ctrl-C):  deepspeed --num_gpus 2 scripts/11_hang.py
"""
import argparse
import os

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.common.record import record
from course_utils.common.records.perf import DebugEnv, Logged
from course_utils.rank.scaffolding import finish, load_exercise, parse_args

INF_RANK, INF_STEP = 1, 2      # this rank's loss is inf on this step (the hang)
NAN_RANK, NAN_STEP = 1, 3      # this rank's loss is nan on this step (the others' are finite): the guard still hangs
NONE_FINITE_STEP = 4           # on this step no rank's loss is finite (-inf on rank 0, nan on the others)
# debugging switches a launch can pass to its ranks (notebook 11's pitfall cell): what each rank found set
DEBUG_VARIABLES = ("CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "TORCH_DISTRIBUTED_DEBUG",
                   "TORCH_CPP_LOG_LEVEL")


def log_metrics(step: int, loss: torch.Tensor) -> float:
    """The mean loss over the ranks, for the log; a rank with a non-finite loss keeps it out of the average."""
    if torch.isfinite(loss):
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item()


def step_loss(step: int, rank: int, device: str) -> torch.Tensor:
    """This rank's loss on ``step`` (stands in for a forward pass): inf on one rank and step, nan on that rank the step
    after, and none finite on the step after that."""
    value = 1.0 + rank + 0.5 * step
    if (rank, step) == (INF_RANK, INF_STEP):
        value = float("inf")
    elif (rank, step) == (NAN_RANK, NAN_STEP):
        value = float("nan")
    elif step == NONE_FINITE_STEP:
        value = float("-inf") if rank == 0 else float("nan")
    return torch.tensor(value, device=device)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=NONE_FINITE_STEP + 1)
    parser.add_argument("--log_metrics_file", default=None, help="file defining log_metrics() (exercise 3)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    log = log_metrics
    if args.log_metrics_file:
        log = load_exercise(args.log_metrics_file, ["log_metrics"])["log_metrics"]
    deepspeed.init_distributed()
    rank, device = dist.get_rank(), get_accelerator().current_device_name()
    record(DebugEnv({k: os.environ[k] for k in DEBUG_VARIABLES if k in os.environ}, dist.get_backend()))
    for step in range(args.steps):
        loss = step_loss(step, rank, device)
        print(f"step {step}: my loss {loss.item()}", flush=True)
        logged = log(step, loss.clone())
        print(f"step {step}: logged {logged}", flush=True)
        record(Logged(step, loss.item(), logged))
    print("end of epoch: waiting for every rank", flush=True)
    dist.barrier()
    finish()


if __name__ == "__main__":
    main()
