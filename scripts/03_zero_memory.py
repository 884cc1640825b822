"""ZeRO stages 0-3 on the same GPT-2, in one launch: per-rank bytes of parameters, gradients and
optimizer states, measured by walking what each engine holds after backward (before the step).

Run from a terminal:  deepspeed --num_gpus 2 scripts/03_zero_memory.py --stages 0 1 2 3 --dtypes fp32 bf16
"""
import argparse

import deepspeed
import torch
import torch.distributed as dist

from course_utils import record
from course_utils.memory import model_state_bytes, tensor_inventory
from course_utils.scripting import finish, parse_args, rank0_print
from course_utils.zero_lab import (accelerator_bytes, build_model, ds_config, forward_backward, num_params,
                                   release)

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
parser.add_argument("--show_partitions", action="store_true", help="also show stage 3's ds_tensor, "
                    "GatheredParameters and zero.Init")
args = parse_args(parser)
deepspeed.init_distributed()
rank, world_size = dist.get_rank(), dist.get_world_size()


def measure(stage: int, dtype: str) -> None:
    """Build, take one full step (so Adam's states exist), then measure after the next backward."""
    model = build_model()
    psi = num_params(model)
    config = ds_config(stage, dtype)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    forward_backward(engine, 0)
    engine.step()
    forward_backward(engine, 1)                      # model states now at their peak: grads are held
    inventory = tensor_inventory(engine)
    measured = model_state_bytes(inventory)
    grad_partition = sum(p.numel() for group in getattr(engine.optimizer, "params_in_partition", [])
                         for p in group)                         # stage 1/2: whole params touching my partition
    threshold = config["zero_optimization"].get("stage3_param_persistence_threshold", 0)
    persistent = sum(p.ds_numel for p in engine.module.parameters() if stage == 3 and p.ds_numel <= threshold)
    record("zero_memory", {"stage": stage, "world_size": world_size, "dtype": dtype, "rank": rank,
                           "num_params": psi, "measured": measured, "accelerator": accelerator_bytes(),
                           "optimizer_class": type(engine.optimizer).__name__,
                           "persistent_numel": persistent, "grad_partition_numel": grad_partition})
    if rank == 0:
        record("inventory", {"stage": stage, "dtype": dtype,
                             "tensors": [vars(e) for e in inventory if e.nbytes >= 1 << 16]})
    rank0_print(f"stage {stage} {dtype}: {type(engine.optimizer).__name__:32s} "
                + "  ".join(f"{k}={v / 2**20:7.1f} MiB" for k, v in measured.items()))
    engine.step()
    release(engine)


def show_partitions() -> None:
    """Stage 3 made visible: each rank's shard of one weight, the whole weight gathered, zero.Init."""
    config = ds_config(3, "fp32")
    with deepspeed.zero.Init(config_dict_or_path=config):    # parameters are partitioned as they are created
        model = build_model()
    weight = model.transformer.h[0].mlp.c_fc.weight
    record("zero_init", {"rank": rank, "shape": list(weight.ds_shape), "ds_numel": weight.ds_numel,
                         "ds_tensor_numel": weight.ds_tensor.numel(), "data_numel": weight.data.numel(),
                         "status": str(weight.ds_status)})
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    shard = weight.ds_tensor
    record("shard", {"rank": rank, "numel": shard.numel(), "first": shard[:3].tolist()})
    with deepspeed.zero.GatheredParameters(weight):           # all-gather: every rank sees the whole weight
        full = weight.data.flatten()
        start = rank * shard.numel()
        record("gathered", {"rank": rank, "numel": full.numel(),
                            "shard_matches": bool(torch.equal(full[start:start + 3], shard[:3]))})
    record("after_gather_numel", {"rank": rank, "numel": weight.data.numel()})
    release(engine)


for dtype in args.dtypes:
    for stage in args.stages:
        measure(stage, dtype)
if args.show_partitions:
    show_partitions()
finish()
