"""DeepSpeed's own optimizers and schedulers, each built from a config by deepspeed.initialize.

For every optimizer section of course_utils.rank.optimizers.OPTIMIZERS: build the engine (or record the
error DeepSpeed raises), record the optimizer class it chose, train a few steps. For every scheduler
section: record the learning rate the engine uses at each step.

Run from a terminal:  deepspeed --num_gpus 2 scripts/07_optimizers_and_schedulers.py --deepspeed_config configs/07_base.json
"""
import argparse
import copy

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.rank.data import random_batch
from course_utils.rank.models import tiny_mlp
from course_utils.rank.optimizers import OPTIMIZERS, held_out_loss, scheduler_sections
from course_utils.common.record import record
from course_utils.common.records.schedules import LrCurve, OptimizerOutcome
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print


def optimizer_config(base: dict, label: str) -> dict:
    """The launch's config with the optimizer section (and extra keys) of ``OPTIMIZERS[label]``."""
    section, extra = OPTIMIZERS[label]
    return {**copy.deepcopy(base), "optimizer": copy.deepcopy(section), **copy.deepcopy(extra)}


def scheduler_config(base: dict, section: dict) -> dict:
    """The launch's config with AdamW and the scheduler ``section``."""
    return {**copy.deepcopy(base), "optimizer": OPTIMIZERS["AdamW"][0], "scheduler": section}


def train(engine, steps: int, device: str) -> list[float]:
    """Train ``steps`` steps on this rank's batches; return the losses."""
    losses = []
    for step in range(steps):
        x, y = random_batch(step, dist.get_rank())
        loss = torch.nn.functional.cross_entropy(engine(x.to(device)), y.to(device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def try_optimizer(base: dict, label: str, steps: int, device: str) -> OptimizerOutcome:
    """Build the engine of one optimizer section and train ``steps`` steps, or report why it failed."""
    try:
        engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=optimizer_config(base, label))
    except Exception as err:
        return OptimizerOutcome(label=label, outcome=type(err).__name__, error=str(err).splitlines()[0][:300])
    inner = engine.basic_optimizer
    before = held_out_loss(engine, device)
    outcome = OptimizerOutcome(label=label, outcome="ok", optimizer_class=f"{type(inner).__module__}.{type(inner).__name__}",
                               adam_w_mode=getattr(inner, "adam_w_mode", getattr(inner, "adamw_mode", None)),
                               wrapper=type(engine.optimizer).__name__, losses=train(engine, steps, device))
    outcome.held_out = [before, held_out_loss(engine, device)]
    engine.destroy()
    return outcome


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40, help="steps of each scheduler run")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up steps of the warm-up schedulers")
    parser.add_argument("--optimizer_steps", type=int, default=5, help="training steps of each optimizer")
    parser.add_argument("--only_config_scheduler", action="store_true",
                        help="only the config's own \"scheduler\" section (recorded as \"yours\"), no optimizers")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    device = get_accelerator().current_device_name()
    base = load_config(args)

    for label in () if args.only_config_scheduler else OPTIMIZERS:
        outcome = try_optimizer(base, label, args.optimizer_steps, device)
        record(outcome)
        if outcome.outcome == "ok":
            rank0_print(f"{label:24s} {outcome.optimizer_class} (wrapped by {outcome.wrapper}), "
                        f"held-out loss {outcome.held_out[0]:.3f} → {outcome.held_out[1]:.3f}")
        else:
            rank0_print(f"{label:24s} {outcome.outcome}: {outcome.error}")

    sections = {"yours": base["scheduler"]} if args.only_config_scheduler else scheduler_sections(args.steps, args.warmup)
    for label, section in sections.items():
        engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=scheduler_config(base, section))
        lrs, betas = [], []
        for _ in range(args.steps):
            lrs.append(engine.get_lr()[0])             # the learning rate this step will use
            betas.append(list(engine.get_mom()[0]))    # and the betas
            train(engine, 1, device)
        record(LrCurve(label=label, scheduler=type(engine.lr_scheduler).__name__, lr=lrs, betas=betas))
        engine.destroy()
    rank0_print("scheduler curves recorded")
    finish()


if __name__ == "__main__":
    main()
