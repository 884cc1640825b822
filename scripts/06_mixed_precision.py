"""Mixed precision on real ranks: the dtypes a DeepSpeed engine holds, the bytes its gradient
all-reduce moves, fp16 loss scaling live, and the engine's LR scheduler on skipped steps.

Part 1 builds one ZeRO-1 engine per precision (fp32, bf16, bf16 with fp32 gradient reductions,
torch_autocast in bf16 and in fp16, fp16) and records the dtypes of the module parameters, the
optimizer's master copy, the gradients and the forward output, and what DeepSpeed's comms logger saw
during one training step (the gradient all_reduce's bytes, to divide by the number of parameters).
Part 2 trains with the config's "fp16" section twice: with dynamic loss scaling (loss_scale 0) and
with a static scale, recording the loss scale, the overflows (skipped steps) and the learning rate
per step. On a GPU the fp16 engine itself does this. On a CPU DeepSpeed refuses fp16 (see notebook
06), so the same keys drive DeepSpeed's own loss scalers (DynamicLossScaler / LossScaler) around an
fp16 model with an fp32 master copy, with the overflow check all-reduced over the ranks as the
ZeRO optimizer does; DeepSpeed's DynamicLossScaler is also fed one overflow pattern with and without
"consecutive_hysteresis".
Part 3 trains a bf16 engine (fp16 where bf16 is missing) with the config's WarmupLR scheduler and makes
one rank's loss inf on chosen steps: the engine's own overflow check skips those steps, and its own
scheduler stepping (engine._take_model_step) leaves the learning rate where it was.

Run from a terminal:  deepspeed --num_gpus 2 scripts/06_mixed_precision.py --deepspeed_config configs/06_loss_scaling.json
"""
import argparse
import copy

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.lr_schedules import WarmupLR
from deepspeed.runtime.utils import has_inf_or_nan

from course_utils.rank import comms
from course_utils.rank.data import random_batch
from course_utils.rank.engine import dtype_name, engine_dtypes, scaler_for
from course_utils.rank.models import count_parameters, tiny_mlp
from course_utils.rank.optimizers import held_out_loss
from course_utils.common.record import record
from course_utils.common.records.precision import (GRAD_MESSAGE_MIN_BYTES, EngineDtypes, EngineError, EngineLr,
    HysteresisDemo, Trace)
from course_utils.rank.scaffolding import finish, load_config, parse_args, rank0_print

PRECISIONS = ["fp32", "bf16", "bf16+fp32 comm", "torch_autocast bf16", "torch_autocast fp16", "fp16"]
AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


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
    if name.startswith("torch_autocast"):            # fp32 weights, the forward under torch.autocast(<dtype>)
        cfg["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_DTYPES[name.split()[-1]]}
    return cfg


def lr_config(base: dict, precision: str) -> dict:
    """The launch's config with its WarmupLR scheduler, in bf16 (or fp16 with a static scale of 1, so that only
    the forced steps overflow)."""
    cfg = copy.deepcopy(base)
    cfg.pop("fp16", None)
    cfg[precision] = {"enabled": True} if precision == "bf16" else {"enabled": True, "loss_scale": 1}
    return cfg


def loss_scaling_runs(fp16: dict, static_scales: list[float]) -> list[tuple[str, dict]]:
    """(label, "fp16" section) of each loss-scaling run: the config's dynamic one, then one per static scale."""
    return [("dynamic", fp16)] + [(f"static {int(s)}", {**fp16, "loss_scale": s}) for s in static_scales]


# ---- Part 1: what each precision keeps in which dtype ------------------------------------------
def record_dtypes(base: dict, device: str) -> None:
    """One ZeRO-1 engine per precision: record the dtypes it holds and the bytes its collectives moved in one
    step (or why it was refused)."""
    rank = dist.get_rank()
    for name in PRECISIONS:
        model = tiny_mlp()
        try:
            engine, *_ = deepspeed.initialize(model=model, config=comms.with_comms_logger(precision_config(base, name)))
        except ValueError as err:                      # fp16 on a CPU without native fp16 support
            record(EngineError(precision=name, error=f"{type(err).__name__}: {err}"))
            rank0_print(f"{name}: deepspeed.initialize refused: {err}")
            continue
        x, y = random_batch(0, rank)
        low = engine.module[0].weight.dtype
        with comms.logged() as window:
            out = engine(x.to(device, low))
            loss = torch.nn.functional.cross_entropy(out.float(), y.to(device))
            engine.backward(loss)
            dtypes = engine_dtypes(engine)
            engine.step()
        found = EngineDtypes(precision=name, loss_scale=float(getattr(engine.optimizer, "loss_scale", 1.0)),
                             forward=dtype_name(out.dtype), psi=count_parameters(model), messages=window.messages,
                             grad_allreduce_bytes=window.bytes(GRAD_MESSAGE_MIN_BYTES).get("all_reduce", 0),
                             **dtypes)
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
        if step == steps - 1:       # after a backward: step() frees the gradient partition engine_dtypes reads
            trace.dtypes = engine_dtypes(engine)
        engine.step()
        trace.overflow.append(bool(engine.optimizer.overflow))
        trace.lr.append(engine.get_lr()[0])
        trace.loss.append(loss.item())
        trace.held_out.append(held_out_loss(engine, device, torch.half))
    trace.engine_skipped_steps = engine.skipped_steps
    engine.destroy()
    return trace


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
        trace.held_out.append(held_out_loss(model, device, torch.half))
    param = next(model.parameters())
    trace.dtypes = {"module": dtype_name(param.dtype), "master": dtype_name(master[0].dtype),
                    "grad": dtype_name(param.grad.dtype)}
    return trace


def hysteresis_demo(fp16: dict, pattern: list[bool]) -> HysteresisDemo:
    """The scale before each step of DeepSpeed's DynamicLossScaler (built from ``fp16``) given ``pattern``'s
    overflows, once with consecutive_hysteresis false (the default) and once true."""
    demo = HysteresisDemo(overflow=list(pattern), hysteresis=fp16["hysteresis"])
    for consecutive in (False, True):
        scaler = scaler_for({**fp16, "loss_scale": 0, "consecutive_hysteresis": consecutive})
        scales = []
        for overflow in pattern:
            scales.append(float(scaler.loss_scale))
            scaler.update_scale(overflow)
        demo.scale[str(consecutive).lower()] = scales
    return demo


# ---- Part 3: the engine's scheduler on skipped steps ---------------------------------------------
def lr_run(base: dict, steps: int, inf_steps: list[int], device: str) -> EngineLr:
    """Train an engine with the config's WarmupLR; on ``inf_steps`` the last rank's loss is multiplied by inf,
    so its gradients (and, after the all-reduce, every rank's) are inf/NaN. The engine checks the gradients
    (ZeRO's ``has_overflow``; for bf16 because ``bf16.check_grad_overflow`` defaults to true), skips the step and
    does not step its scheduler."""
    precision = "bf16" if get_accelerator().is_bf16_supported() else "fp16"
    engine, *_ = deepspeed.initialize(model=tiny_mlp(), config=lr_config(base, precision))
    rank, inf_rank = dist.get_rank(), dist.get_world_size() - 1
    run = EngineLr(precision=precision, inf_rank=inf_rank, inf_steps=list(inf_steps), lr_start=engine.get_lr()[0])
    low = engine.module[0].weight.dtype
    for step in range(steps):
        x, y = random_batch(step, rank)
        loss = torch.nn.functional.cross_entropy(engine(x.to(device, low)).float(), y.to(device))
        if step in inf_steps and rank == inf_rank:
            loss = loss * float("inf")
        engine.backward(loss)
        engine.step()
        run.overflow.append(bool(engine.optimizer.overflow))
        run.skipped_steps.append(int(engine.skipped_steps))
        run.scheduler_iteration.append(int(engine.lr_scheduler.last_batch_iteration))
        run.lr.append(float(engine.get_lr()[0]))
    engine.destroy()
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60, help="training steps of each loss-scaling run")
    parser.add_argument("--static_loss_scales", type=float, nargs="*", default=[2.0 ** 24, 2.0 ** 10],
                        help="one static run (fp16.loss_scale = this value) per number")
    parser.add_argument("--lr_steps", type=int, default=14, help="training steps of the scheduler run (part 3)")
    parser.add_argument("--inf_steps", type=int, nargs="*", default=[0, 1, 5, 8, 9],
                        help="steps of the scheduler run on which the last rank's loss is multiplied by inf")
    parser.add_argument("--overflow_pattern", default="ofofoffoof",
                        help="overflow (o) / fine (f) steps fed to DynamicLossScaler with and without "
                             "consecutive_hysteresis")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    if not args.overflow_pattern or set(args.overflow_pattern) - {"o", "f"}:
        raise SystemExit(f"--overflow_pattern takes only the letters o (overflow) and f (fine), "
                         f"got {args.overflow_pattern!r}")
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
                    f"final scale {trace.scale[-1]:g}, held-out loss {trace.held_out[0]:.3f} → {trace.held_out[-1]:.3f}")
    record(hysteresis_demo(base["fp16"], [c == "o" for c in args.overflow_pattern]))
    scheduled = lr_run(base, args.lr_steps, args.inf_steps, device)
    record(scheduled)
    rank0_print(f"scheduler run ({scheduled.precision}): {scheduled.skipped_steps[-1]} steps skipped, "
                f"lr after each step {scheduled.lr}")
    finish()


if __name__ == "__main__":
    main()
