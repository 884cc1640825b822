"""A training job that survives preemption: on SIGUSR1 every rank agrees to stop at the next step boundary, saves a
DeepSpeed checkpoint, and ends cleanly; the batch script then requeues the job (notebook 18, section 5), and the
requeued run loads the checkpoint and goes on from the step after it.

- The signal: Slurm sends it to every process of the job's steps ``sig_time`` seconds before the time limit
  (``sbatch --signal=USR1@<sig_time>``), or when you ask (``scancel --signal=USR1 <job>``). The handler only sets a
  flag; the ranks meet at each step boundary (an all_reduce of the flags), so they stop at the same step even when
  the signal reaches the nodes at different moments. Rank 0 then leaves ``preempted`` in the checkpoint folder: the batch
  script requeues the job when it finds it.
- The resume: ``load_checkpoint`` restores weights, ZeRO's optimizer partitions and DeepSpeed's counters; the data
  position is this script's own, kept in ``client_state``. Each step's batch is a function of the step and the rank,
  so a run that resumes at step k+1 sees the batch an uninterrupted run would.
- ``--after_save``: once saved, take the next step as an uninterrupted run would and record its loss, the figure the
  resumed run's first step must reproduce (a lesson's measurement: a real job stops at the save).

Run under Slurm (one launcher per node; the launcher ignores USR1, the ranks catch it):
    srun bash -c "trap '' USR1; exec deepspeed --hostfile h --no_ssh --node_rank=\\$SLURM_NODEID \\
        --master_addr <first node> scripts/18_preempt.py --checkpoint <shared folder>"
"""
import argparse
import os
import signal
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common.record import record
from course_utils.common.records.slurm import PreemptRun
from course_utils.rank.models import tiny_mlp
from course_utils.rank.scaffolding import finish, parse_args

CONFIG = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 10**6,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": 1}}
STOP = {"signal": None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", default="checkpoint",
                        help="a folder every node reaches (a shared file system): where the job saves and resumes")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step_seconds", type=float, default=0.25, help="each step lasts at least this long")
    parser.add_argument("--after_save", action="store_true", help="take one more step after saving, and record it")
    return parser


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s micro-batch on ``rank``: the same wherever and whenever that step runs."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(CONFIG["train_micro_batch_size_per_gpu"], 16, generator=g)
    return x, (x[:, :4].sum(dim=1) > 0).long() + 2 * (x[:, 4] > 0).long()


def train_step(engine, step: int) -> float:
    """One optimizer step; the loss averaged over the ranks."""
    x, y = batch(step, dist.get_rank())
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def stop_requested() -> bool:
    """Whether any rank has caught the signal: every rank answers the same, at the same step."""
    flag = torch.tensor([0 if STOP["signal"] is None else 1])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    signal.signal(signal.SIGUSR1, lambda signum, frame: STOP.update(signal=time.time()))
    deepspeed.init_distributed(dist_backend="gloo")
    model = tiny_mlp(seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    rank, restart = dist.get_rank(), int(os.environ.get("SLURM_RESTART_COUNT", 0))
    first = 0
    if os.path.exists(os.path.join(args.checkpoint, "latest")):
        path, client_state = engine.load_checkpoint(args.checkpoint)
        if path is None:
            raise FileNotFoundError(f"{args.checkpoint} names a checkpoint that load_checkpoint could not read")
        first = client_state["step"]
        if rank == 0:
            print(f"run {restart}: resumed from {path} at step {first + 1}", flush=True)
    steps, losses, saved = [], [], None
    for step in range(first, args.steps):
        if stop_requested():
            engine.save_checkpoint(args.checkpoint, client_state={"step": step})
            saved = step
            if rank == 0:
                Path(args.checkpoint, "preempted").write_text(f"{step}\n")
                print(f"run {restart}: USR1 caught; checkpoint saved after step {step}", flush=True)
            break
        losses.append(train_step(engine, step))
        steps.append(step + 1)
        if rank == 0:
            print(f"run {restart}: step {step + 1:2d}  loss {losses[-1]:.6f}", flush=True)
        time.sleep(args.step_seconds)
    after = train_step(engine, saved) if saved is not None and args.after_save and saved < args.steps else None
    record(PreemptRun(restart=restart, rank=rank, world_size=dist.get_world_size(), node=os.environ.get("SLURMD_NODENAME"),
                      resumed_at=first + 1 if first else None, steps=steps, losses=losses,
                      caught=STOP["signal"] is not None, saved_after=saved, after_save=after))
    finish()


if __name__ == "__main__":
    main()
