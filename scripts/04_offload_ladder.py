"""The speed/memory ladder in one launch: stage 0 → 1 → 2 → 2+offload → 3 → 3+offload (and optionally
NVMe, the client-optimizer case and stage-3 knobs), each with seconds per step, accelerator/host
model-state bytes and peak RSS.

Run from a terminal:  deepspeed --num_gpus 2 scripts/04_offload_ladder.py --steps 3
"""
import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils import record
from course_utils.memory import tensor_inventory
from course_utils.scripting import finish, parse_args, rank0_print
from course_utils.zero_lab import (LADDER, accelerator_bytes, build_model, ds_config, forward_backward, gathered_numel,
                                   current_rss_bytes, nvme_offload, peak_rss_bytes, placement_bytes, release, reset_peak_rss,
                                   training_dtype)

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--rungs", nargs="*", default=list(LADDER), help=f"any of {list(LADDER)}")
parser.add_argument("--steps", type=int, default=3, help="timed steps per rung (after one warm-up step)")
parser.add_argument("--nvme_dir", default=None, help="also run stage 3 with NVMe offload into this folder")
parser.add_argument("--client_optimizer", action="store_true",
                    help="also offload with a torch AdamW: refused, then allowed by zero_force_ds_cpu_optimizer=false")
parser.add_argument("--knobs", default=None, help="JSON {name: {stage3 keys}} to compare on stage 3 + offload")
args = parse_args(parser)
deepspeed.init_distributed()
rank = dist.get_rank()
ACC = get_accelerator().device_name()


DTYPE = training_dtype()


def run(name: str, stage: int, zero: dict, client_optimizer=None, count_swap_in: str | None = None) -> None:
    """Build, warm up one step, time ``--steps`` steps; record time, placement of bytes and peak RSS."""
    config = ds_config(stage, DTYPE, **zero)
    if client_optimizer is not None:
        config.pop("optimizer")
        config["zero_force_ds_cpu_optimizer"] = False
    model = build_model()
    reset_peak_rss()
    rss_start = current_rss_bytes()
    optimizer = client_optimizer(model.parameters()) if client_optimizer else None
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                      optimizer=optimizer)
    forward_backward(engine, 0)
    engine.step()
    live = [0]          # stage 3: most parameter elements gathered whole when any module starts its forward
    hooks = [m.register_forward_pre_hook(lambda *_: live.__setitem__(0, max(live[0], gathered_numel(engine.module))))
             for m in engine.module.modules()] if stage == 3 else []
    times = []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        loss = forward_backward(engine, step)
        backward_done = time.perf_counter()
        if step == args.steps:                  # measure where model states peak: after backward, before step
            inventory = tensor_inventory(engine)
        step_start = time.perf_counter()
        engine.step()
        times.append(backward_done - start + time.perf_counter() - step_start)
    out = {"name": name, "rank": rank, "dtype": DTYPE, "step_seconds": statistics.median(times),
           **placement_bytes(inventory, config["zero_optimization"], ACC),
           "peak_rss": peak_rss_bytes(), "rss_start": rss_start, "accelerator_peak": accelerator_bytes()["peak"],
           "gathered_in_forward": live[0],
           "persistent_numel": sum(p.ds_numel for p in engine.module.parameters() if getattr(p, "ds_persist", False)),
           "optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__, "loss": loss}
    if count_swap_in:
        out["swap_files"] = sorted(str(p.relative_to(count_swap_in)) for p in Path(count_swap_in).rglob("*.swp"))
    for h in hooks:
        h.remove()
    record("rung", out)
    rank0_print(f"{name:28s} {out['step_seconds']:6.3f} s/step  device {out['device_bytes'] / 2**20:7.1f} MiB  "
                f"host {out['host_bytes'] / 2**20:7.1f} MiB  peak RSS {out['peak_rss'] / 2**20:7.1f} MiB")
    release(engine)


for name in args.rungs:
    stage, zero = LADDER[name]
    run(name, stage, copy.deepcopy(zero))
if args.nvme_dir:
    folder = str(Path(args.nvme_dir) / f"rank{rank}")
    run("stage 3 + NVMe", 3, nvme_offload(folder), count_swap_in=folder)
if args.client_optimizer:
    stage, zero = LADDER["stage 2 + offload"]
    try:      # the default: DeepSpeed refuses a client optimizer with offload
        config = ds_config(stage, DTYPE, **zero)
        config.pop("optimizer")
        model = build_model()
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                             optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4))
        record("force_ds_cpu_optimizer_error", None)
    except Exception as e:          # ZeRORuntimeException
        record("force_ds_cpu_optimizer_error", f"{type(e).__name__}: {e}")
    run("stage 2 + offload, torch AdamW", stage, copy.deepcopy(zero),
        client_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4))
if args.knobs:
    for label, knobs in json.loads(args.knobs).items():
        run(f"knobs: {label}", 3, copy.deepcopy(LADDER["stage 3 + offload"][1]) | knobs)
finish()
