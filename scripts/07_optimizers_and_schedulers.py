"""DeepSpeed's own optimizers and schedulers, each built from a config by deepspeed.initialize.

For every optimizer section of course_utils.schedules.OPTIMIZERS: build the engine (or record the
error DeepSpeed raises), record the optimizer class it chose, train a few steps. For every scheduler
section: record the learning rate the engine uses at each step.

Run from a terminal:  deepspeed --num_gpus 2 scripts/07_optimizers_and_schedulers.py --deepspeed_config configs/07_base.json
"""
import argparse
import copy
import json

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils import record
from course_utils.precision import random_batch, tiny_mlp
from course_utils.schedules import OPTIMIZERS, scheduler_sections
from course_utils.scripting import finish, parse_args, rank0_print

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--steps", type=int, default=40, help="steps of each scheduler run")
parser.add_argument("--warmup", type=int, default=10, help="warm-up steps of the warm-up schedulers")
parser.add_argument("--optimizer_steps", type=int, default=5, help="training steps of each optimizer")
args = parse_args(parser)
deepspeed.init_distributed()
rank = dist.get_rank()
device = get_accelerator().current_device_name()
base = json.load(open(args.deepspeed_config))


def train(engine, steps: int) -> list[float]:
    """Train ``steps`` steps on this rank's batches; return the losses."""
    losses = []
    for step in range(steps):
        x, y = random_batch(step, rank)
        loss = torch.nn.functional.cross_entropy(engine(x.to(device)), y.to(device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


for label, (section, extra) in OPTIMIZERS.items():
    cfg = {**copy.deepcopy(base), "optimizer": section, **extra}
    try:
        engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=cfg)
    except Exception as err:
        record("optimizer", {"label": label, "outcome": type(err).__name__, "error": str(err).splitlines()[0][:300]})
        rank0_print(f"{label:24s} {type(err).__name__}: {err}")
        continue
    inner = engine.basic_optimizer
    losses = train(engine, args.optimizer_steps)
    record("optimizer", {"label": label, "outcome": "ok", "class": f"{type(inner).__module__}.{type(inner).__name__}",
                         "adam_w_mode": getattr(inner, "adam_w_mode", getattr(inner, "adamw_mode", None)),
                         "wrapper": type(engine.optimizer).__name__, "losses": losses})
    rank0_print(f"{label:24s} {type(inner).__name__} (wrapped by {type(engine.optimizer).__name__}), "
                f"loss {losses[0]:.3f} → {losses[-1]:.3f}")
    engine.destroy()

for label, section in scheduler_sections(args.steps, args.warmup).items():
    cfg = {**copy.deepcopy(base), "optimizer": OPTIMIZERS["AdamW"][0], "scheduler": section}
    engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=cfg)
    lrs = []
    for step in range(args.steps):
        lrs.append(engine.get_lr()[0])             # the learning rate this step will use
        train(engine, 1)
    record("lr_curve", {"label": label, "scheduler": type(engine.lr_scheduler).__name__, "lr": lrs})
    engine.destroy()
rank0_print("scheduler curves recorded")
finish()
