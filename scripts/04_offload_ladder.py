"""The speed/memory ladder in one launch: stage 0 → 1 → 2 → 2+offload → 3 → 3+offload (and optionally
NVMe, the client-optimizer case and stage-3 knobs), each with seconds per step, accelerator/host
model-state bytes and peak RSS.

Run from a terminal:  deepspeed --num_gpus 2 scripts/04_offload_ladder.py --steps 3
"""
import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from course_utils.rank.engine import (LADDER, accelerator_bytes, ds_config, forward_backward, gathered_numel,
                                      nvme_offload, release, training_dtype)
from course_utils.rank.memory import (current_rss_bytes, peak_rss_bytes, placement_bytes, reset_peak_rss,
                                      tensor_inventory)
from course_utils.rank.models import tiny_gpt2
from course_utils.rank.record import Record, record
from course_utils.rank.scaffolding import finish, parse_args, rank0_print


@dataclass
class Rung(Record, name="rung"):
    """One rung of the ladder on one rank: speed, where the model states are, and the process's memory."""
    name: str
    rank: int
    dtype: str
    step_seconds: float           # median of the timed steps (forward + backward + step, no measuring)
    device_bytes: int             # model states on the accelerator (CPU machine: not offloaded)
    host_bytes: int               # model states in host memory (CPU machine: offloaded)
    peak_rss: int                 # VmHWM since the rung began
    rss_start: int                # VmRSS when the rung began
    accelerator_peak: int
    gathered_in_forward: int      # stage 3: most parameter elements gathered whole at a module's forward
    persistent_numel: int         # stage 3: elements of the parameters kept whole on every rank
    optimizer: str                # the torch optimizer class doing the step
    loss: float
    swap_files: list | None = None   # NVMe: the swap files found in the rank's folder


def make_rung(name: str, *, rank: int, dtype: str, step_times: list[float], inventory, zero: dict, accelerator: str,
              rss_start: int, peak_rss: int, accelerator_peak: int, gathered_in_forward: int, persistent_numel: int,
              optimizer: str, loss: float, swap_dir: str | None = None) -> Rung:
    """The ``rung`` record from one rung's measurements: the median step time and the model-state bytes
    split between accelerator and host (:func:`course_utils.rank.memory.placement_bytes`)."""
    placed = placement_bytes(inventory, zero, accelerator)
    swap_files = (sorted(str(p.relative_to(swap_dir)) for p in Path(swap_dir).rglob("*.swp"))
                  if swap_dir is not None else None)
    return Rung(name=name, rank=rank, dtype=dtype, step_seconds=statistics.median(step_times),
                device_bytes=placed["device_bytes"], host_bytes=placed["host_bytes"], peak_rss=peak_rss,
                rss_start=rss_start, accelerator_peak=accelerator_peak, gathered_in_forward=gathered_in_forward,
                persistent_numel=persistent_numel, optimizer=optimizer, loss=loss, swap_files=swap_files)


def run(name: str, stage: int, zero: dict, steps: int, dtype: str, client_optimizer=None,
        swap_dir: str | None = None) -> None:
    """Build, warm up one step, time ``steps`` steps; record time, placement of bytes and peak RSS."""
    config = ds_config(stage, dtype, **zero)
    if client_optimizer is not None:
        config.pop("optimizer")
        config["zero_force_ds_cpu_optimizer"] = False
    model = tiny_gpt2("zero_lab")
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
    for step in range(1, steps + 1):
        start = time.perf_counter()
        loss = forward_backward(engine, step)
        backward_done = time.perf_counter()
        if step == steps:                       # measure where model states peak: after backward, before step
            inventory = tensor_inventory(engine)
        step_start = time.perf_counter()
        engine.step()
        times.append(backward_done - start + time.perf_counter() - step_start)
    for h in hooks:
        h.remove()
    rung = make_rung(name, rank=dist.get_rank(), dtype=dtype, step_times=times, inventory=inventory,
                     zero=config["zero_optimization"], accelerator=get_accelerator().device_name(),
                     rss_start=rss_start, peak_rss=peak_rss_bytes(), accelerator_peak=accelerator_bytes()["peak"],
                     gathered_in_forward=live[0],
                     persistent_numel=sum(p.ds_numel for p in engine.module.parameters() if getattr(p, "ds_persist", False)),
                     optimizer=type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__, loss=loss,
                     swap_dir=swap_dir)
    record(rung)
    rank0_print(f"{name:28s} {rung.step_seconds:6.3f} s/step  device {rung.device_bytes / 2**20:7.1f} MiB  "
                f"host {rung.host_bytes / 2**20:7.1f} MiB  peak RSS {rung.peak_rss / 2**20:7.1f} MiB")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rungs", nargs="*", default=list(LADDER), help=f"any of {list(LADDER)}")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per rung (after one warm-up step)")
    parser.add_argument("--nvme_dir", default=None, help="also run stage 3 with NVMe offload into this folder")
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
    if args.nvme_dir:
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
