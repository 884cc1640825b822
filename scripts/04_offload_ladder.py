"""The speed/memory ladder in one launch: stage 0 → 1 → 2 → 2+offload → 3 → 3+offload (and optionally
NVMe, the client-optimizer case and stage-3 knobs), each with seconds per step (split into forward + backward,
the engine's step and the optimizer's own kernel) and where the model states are: every tensor the engine
holds, by the DeepSpeed structure holding it, its device, and the side DeepSpeed placed it on (accelerator,
host, or NVMe files).

Run from a terminal:  deepspeed --num_gpus 2 scripts/04_offload_ladder.py --steps 3
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.rank.engine import (accelerator_bytes, ds_config, forward_backward, gathered_numel, nvme_offload,
    release, reset_accelerator_peak, training_dtype)
from course_utils.rank.memory import locked_bytes, tensor_inventory
from course_utils.common.zero_rules import LADDER
from course_utils.rank.models import tiny_gpt2
from course_utils.rank.placement import holdings, host_side_storages, make_rung, swap_buffers, with_parameter_swapper
from course_utils.common.record import record
from course_utils.rank.scaffolding import finish, parse_args, rank0_print


def timed(optimizer, spent: list[float]) -> None:
    """Wrap ``optimizer.step`` (the torch optimizer doing the arithmetic) so that each call adds its seconds
    to ``spent``: the optimizer's own kernel, apart from the engine's copies and communication around it."""
    step = optimizer.step

    def timed_step(*args, **kwargs):
        started = time.perf_counter()
        out = step(*args, **kwargs)
        spent.append(time.perf_counter() - started)
        return out
    optimizer.step = timed_step


def run(name: str, stage: int, zero: dict, steps: int, dtype: str, client_optimizer=None,
        swap_dir: str | None = None) -> None:
    """Build, warm up one step, time ``steps`` steps (and their phases); record time and placement of bytes."""
    config = ds_config(stage, dtype, **zero)
    if client_optimizer is not None:
        config.pop("optimizer")
        config["zero_force_ds_cpu_optimizer"] = False
    model = tiny_gpt2("zero_lab")
    reset_accelerator_peak()
    optimizer = client_optimizer(model.parameters()) if client_optimizer else None
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                      optimizer=optimizer)
    forward_backward(engine, 0)
    engine.step()
    live = [0]          # stage 3: most parameter elements gathered whole when any module starts its forward
    hooks = [m.register_forward_pre_hook(lambda *_: live.__setitem__(0, max(live[0], gathered_numel(engine.module))))
             for m in engine.module.modules()] if stage == 3 else []
    inner = getattr(engine.optimizer, "optimizer", None)      # the torch optimizer inside a ZeRO wrapper
    kernel: list[float] = []
    timed(inner if inner is not None else engine.optimizer, kernel)
    times, phases = [], {"forward + backward": [], "engine.step()": [], "optimizer kernel": []}
    for step in range(1, steps + 1):
        start = time.perf_counter()
        loss = forward_backward(engine, step)
        backward_done = time.perf_counter()
        if step == steps:                       # measure where model states peak: after backward, before step
            inventory = with_parameter_swapper(tensor_inventory(engine), engine)
            host_side = host_side_storages(engine)
        kernel.clear()
        step_start = time.perf_counter()
        engine.step()
        step_seconds = time.perf_counter() - step_start
        times.append(backward_done - start + step_seconds)
        for phase, seconds in zip(phases, (backward_done - start, step_seconds, sum(kernel))):
            phases[phase].append(seconds)
    for h in hooks:
        h.remove()
    held = holdings(inventory, type(engine.optimizer).__name__, type(inner).__name__ if inner is not None else None,
                    host_side)
    rung = make_rung(name, rank=dist.get_rank(), dtype=dtype, step_times=times, held=held,
                     accelerator=get_accelerator().device_name(), accelerator_peak=accelerator_bytes()["peak"],
                     gathered_in_forward=live[0],
                     persistent_numel=sum(p.ds_numel for p in engine.module.parameters() if getattr(p, "ds_persist", False)),
                     optimizer=type(inner if inner is not None else engine.optimizer).__name__, loss=loss,
                     swap_dir=swap_dir, phases={k: statistics.median(v) for k, v in phases.items()},
                     swap_buffers=swap_buffers(engine), locked=locked_bytes())
    record(rung)
    buffers = {side: sum(h.bytes for h in held if h.state == "buffers" and h.structure != "module buffer"
                         and h.side == side) / 2**20
               for side in ("accelerator", "host")}
    rank0_print(f"{name:28s} {rung.step_seconds:6.3f} s/step  model states: accelerator side "
                f"{rung.accelerator_side_bytes / 2**20:6.1f} MiB, host side {rung.host_side_bytes / 2**20:6.1f} MiB, "
                f"NVMe files {rung.nvme_bytes / 2**20:6.1f} MiB; DeepSpeed buffers: accelerator side "
                f"{buffers['accelerator']:6.1f} MiB, host side {buffers['host']:6.1f} MiB")
    release(engine)


def client_optimizer_refused(dtype: str) -> None:
    """Record the error DeepSpeed raises for a client (torch) optimizer with offload, or None."""
    stage, zero = LADDER["stage 2 + offload"]
    try:      # the default: DeepSpeed refuses a client optimizer with offload
        config = ds_config(stage, dtype, **zero)
        config.pop("optimizer")
        model = tiny_gpt2("zero_lab")
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                             optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4))
        record("force_ds_cpu_optimizer_error", None)
    except Exception as e:          # ZeRORuntimeException
        record("force_ds_cpu_optimizer_error", f"{type(e).__name__}: {e}")


def nvme_rung_of_the_learner(zero: dict, steps: int, dtype: str) -> None:
    """The NVMe rung with the learner's zero_optimization keys. DeepSpeed's refusal (the same on every rank, at
    engine start) is recorded instead of ending the launch, so the rest of the ladder is still measured."""
    folder = (zero.get("offload_param") or zero.get("offload_optimizer") or {}).get("nvme_path")
    try:
        run("stage 3 + NVMe", zero.get("stage", 3), {k: v for k, v in zero.items() if k != "stage"}, steps, dtype,
            swap_dir=folder)
        record("nvme_error", None)
    except Exception as err:          # noqa: BLE001 — reported to the notebook, which names it
        record("nvme_error", f"{type(err).__name__}: {err}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rungs", nargs="*", default=list(LADDER), help=f"any of {list(LADDER)}")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per rung (after one warm-up step)")
    parser.add_argument("--nvme_dir", default=None, help="also run stage 3 with NVMe offload into this folder")
    parser.add_argument("--nvme_zero", default=None,
                        help="JSON zero_optimization keys for the NVMe rung instead of the course's (notebook 04's exercise)")
    parser.add_argument("--client_optimizer", action="store_true",
                        help="also offload with a torch AdamW: refused, then allowed by zero_force_ds_cpu_optimizer=false")
    parser.add_argument("--knobs", default=None, help="JSON {name: {stage3 keys}} to compare on stage 3 + offload")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    dtype = training_dtype()
    for name in args.rungs:
        stage, zero = LADDER[name]
        run(name, stage, zero, args.steps, dtype)
    if args.nvme_zero:
        nvme_rung_of_the_learner(json.loads(args.nvme_zero), args.steps, dtype)
    elif args.nvme_dir:
        folder = str(Path(args.nvme_dir) / f"rank{dist.get_rank()}")
        run("stage 3 + NVMe", 3, nvme_offload(folder), args.steps, dtype, swap_dir=folder)
    if args.client_optimizer:
        client_optimizer_refused(dtype)
        stage, zero = LADDER["stage 2 + offload"]
        run("stage 2 + offload, torch AdamW", stage, zero, args.steps, dtype,
            client_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4))
    if args.knobs:
        for label, knobs in json.loads(args.knobs).items():
            run(f"knobs: {label}", 3, LADDER["stage 3 + offload"][1] | knobs, args.steps, dtype)
    finish()


if __name__ == "__main__":
    main()
