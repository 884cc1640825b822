"""Mixed precision on real ranks: the dtypes a DeepSpeed engine holds, and fp16 loss scaling live.

Part 1 builds one ZeRO-1 engine per precision (fp32, bf16, bf16 with fp32 gradient reductions, fp16)
and records the dtypes of the module parameters, the optimizer's master copy and the gradients.
Part 2 trains with the config's "fp16" section twice: with dynamic loss scaling (loss_scale 0) and
with a static scale, recording the loss scale, the overflows (skipped steps) and the learning rate
per step. On a GPU the fp16 engine itself does this. On a CPU DeepSpeed refuses fp16 (see notebook
06), so the same keys drive DeepSpeed's own loss scalers (DynamicLossScaler / LossScaler) around an
fp16 model with an fp32 master copy, with the overflow check all-reduced over the ranks as the
ZeRO optimizer does.

Run from a terminal:  deepspeed --num_gpus 2 scripts/06_mixed_precision.py --deepspeed_config configs/06_loss_scaling.json
"""
import argparse
import copy
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
from deepspeed.runtime.lr_schedules import WarmupLR
from deepspeed.runtime.utils import has_inf_or_nan

from course_utils.rank.data import random_batch
from course_utils.rank.engine import dtype_name, engine_dtypes
from course_utils.rank.models import tiny_mlp
from course_utils.rank.record import Record, record
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print

PRECISIONS = ["fp32", "bf16", "bf16+fp32 comm", "fp16"]


@dataclass
class EngineError(Record, name="engine_error"):
    """A precision that ``deepspeed.initialize`` refused on this machine."""
    precision: str
    error: str


@dataclass
class EngineDtypes(Record, name="engine_dtypes"):
    """The dtypes one precision's engine holds (:func:`course_utils.rank.engine.engine_dtypes`)."""
    precision: str
    module: str | None
    master: str | None
    grad: str | None
    communication: str | None
    loss_scale: float


@dataclass
class Trace(Record, name="trace"):
    """One loss-scaling run, step by step."""
    label: str
    scale: list = field(default_factory=list)       # the loss scale each step used
    overflow: list = field(default_factory=list)    # whether the step overflowed (and was skipped)
    lr: list = field(default_factory=list)          # the learning rate after the step
    loss: list = field(default_factory=list)
    dtypes: dict = field(default_factory=dict)      # module / master / grad dtypes at the end
    engine_skipped_steps: int | None = None         # the fp16 engine's own count (GPU only)


def precision_config(base: dict, name: str) -> dict:
    """The launch's config with only its precision section changed."""
    cfg = copy.deepcopy(base)
    cfg.pop("fp16", None)
    cfg.pop("scheduler", None)
    if name == "fp16":
        cfg["fp16"] = base["fp16"]
    elif name.startswith("bf16"):
        cfg["bf16"] = {"enabled": True}
    if name == "bf16+fp32 comm":
        cfg["communication_data_type"] = "fp32"
    return cfg


def loss_scaling_runs(fp16: dict, static_scales: list[float]) -> list[tuple[str, dict]]:
    """(label, "fp16" section) of each loss-scaling run: the config's dynamic one, then one per static scale."""
    return [("dynamic", fp16)] + [(f"static {int(s)}", {**fp16, "loss_scale": s}) for s in static_scales]


# ---- Part 1: what each precision keeps in which dtype ------------------------------------------
def record_dtypes(base: dict, device: str) -> None:
    """One ZeRO-1 engine per precision: record the dtypes it holds (or why it was refused)."""
    rank = dist.get_rank()
    for name in PRECISIONS:
        try:
            engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=precision_config(base, name))
        except ValueError as err:                      # fp16 on a CPU without native fp16 support
            record(EngineError(precision=name, error=f"{type(err).__name__}: {err}"))
            rank0_print(f"{name}: deepspeed.initialize refused: {err}")
            continue
        x, y = random_batch(0, rank)
        low = engine.module[0].weight.dtype
        loss = torch.nn.functional.cross_entropy(engine(x.to(device, low)).float(), y.to(device))
        engine.backward(loss)
        dtypes = engine_dtypes(engine)
        engine.step()
        found = EngineDtypes(precision=name, loss_scale=float(getattr(engine.optimizer, "loss_scale", 1.0)), **dtypes)
        record(found)
        rank0_print(f"{name:15s} {found}")
        engine.destroy()


# ---- Part 2: loss scaling, step by step ---------------------------------------------------------
def engine_run(base: dict, fp16: dict, steps: int, device: str, label: str) -> Trace:
    """GPU: the real fp16 engine; read its loss scale and overflow flag after every step."""
    cfg = copy.deepcopy(base)
    cfg["fp16"] = fp16
    engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=cfg)
    trace = Trace(label)
    for step in range(steps):
        x, y = random_batch(step, dist.get_rank())
        loss = torch.nn.functional.cross_entropy(engine(x.to(device, torch.half)).float(), y.to(device))
        trace.scale.append(float(engine.optimizer.loss_scale))
        engine.backward(loss)
        engine.step()
        trace.overflow.append(bool(engine.optimizer.overflow))
        trace.lr.append(engine.get_lr()[0])
        trace.loss.append(loss.item())
    trace.engine_skipped_steps = engine.skipped_steps
    trace.dtypes = engine_dtypes(engine)
    engine.destroy()
    return trace


def scaler_for(fp16: dict):
    """DeepSpeed's own scaler for an "fp16" config section, built as the ZeRO optimizer builds it."""
    if fp16.get("loss_scale", 0) == 0:
        return DynamicLossScaler(init_scale=2.0 ** fp16["initial_scale_power"], scale_window=fp16["loss_scale_window"],
                                 min_scale=fp16["min_loss_scale"], delayed_shift=fp16["hysteresis"],
                                 consecutive_hysteresis=fp16.get("consecutive_hysteresis", False),
                                 raise_error_at_min_scale=False)
    return LossScaler(scale=fp16["loss_scale"])


def scaler_run(base: dict, fp16: dict, steps: int, device: str, label: str) -> Trace:
    """CPU: an fp16 model and an fp32 master copy, stepped by DeepSpeed's loss scaler and scheduler."""
    model = tiny_mlp().half()
    master = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.AdamW(master, **base["optimizer"]["params"])
    lr_scheduler = WarmupLR(optimizer, **base["scheduler"]["params"])
    scaler = scaler_for(fp16)
    trace = Trace(label)
    for step in range(steps):
        x, y = random_batch(step, dist.get_rank())
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.half()).float(), y)
        trace.scale.append(float(scaler.loss_scale))
        (loss * scaler.loss_scale).backward()                       # fp16 gradients of the scaled loss
        for p in model.parameters():                                 # data parallel: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        overflow = torch.tensor(float(any(bool(has_inf_or_nan(p.grad)) for p in model.parameters())))
        dist.all_reduce(overflow, op=dist.ReduceOp.MAX)             # one rank's inf skips the step everywhere
        overflow = bool(overflow.item())
        scaler.update_scale(overflow)
        if not overflow:                                             # unscale into fp32, step, copy back
            for m, p in zip(master, model.parameters()):
                m.grad = p.grad.float() / trace.scale[-1]
            optimizer.step()
            lr_scheduler.step()
            with torch.no_grad():
                for m, p in zip(master, model.parameters()):
                    p.copy_(m.half())
        trace.overflow.append(overflow)
        trace.lr.append(optimizer.param_groups[0]["lr"])
        trace.loss.append(loss.item())
    param = next(model.parameters())
    trace.dtypes = {"module": dtype_name(param.dtype), "master": dtype_name(master[0].dtype),
                    "grad": dtype_name(param.grad.dtype)}
    return trace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60, help="training steps of each loss-scaling run")
    parser.add_argument("--static_loss_scales", type=float, nargs="*", default=[2.0 ** 24, 2.0 ** 10],
                        help="one static run (fp16.loss_scale = this value) per number")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    rank = dist.get_rank()
    device = get_accelerator().device_name(rank % max(1, get_accelerator().device_count()))
    base = load_config(args)
    record_dtypes(base, device)
    run = engine_run if get_accelerator().is_fp16_supported() else scaler_run
    record("loss_scaling_path", "fp16 engine" if run is engine_run else "DeepSpeed loss scalers on an fp16 model")
    for label, section in loss_scaling_runs(base["fp16"], args.static_loss_scales):
        trace = run(base, section, args.steps, device, label)
        record(trace)
        rank0_print(f"{label}: {sum(trace.overflow)} of {args.steps} steps skipped, "
                    f"final scale {trace.scale[-1]:g}, final loss {trace.loss[-1]:.3f}")
    finish()


if __name__ == "__main__":
    main()
