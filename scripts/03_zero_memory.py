"""ZeRO stages 0-3 on the same GPT-2, in one launch: per-rank bytes of parameters, gradients and
optimizer states, measured by walking what each engine holds after backward (before the step).

Run from a terminal:  deepspeed --num_gpus 2 scripts/03_zero_memory.py --stages 0 1 2 3 --dtypes fp32 bf16
"""
import argparse
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist

from course_utils.rank.engine import accelerator_bytes, ds_config, forward_backward, release
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.models import count_parameters, tiny_gpt2
from course_utils.rank.record import Record, record
from course_utils.rank.scaffolding import finish, parse_args, rank0_print


@dataclass
class ZeroMemory(Record, name="zero_memory"):
    """What one rank's engine holds at the peak of model states, for one stage and dtype."""
    stage: int
    world_size: int
    dtype: str
    rank: int
    num_params: int
    measured: dict                # model_state_bytes: params, grads, optimizer, buffers, model_states
    accelerator: dict             # accelerator_bytes: allocated, peak
    optimizer_class: str
    persistent_numel: int         # stage 3: elements of the parameters kept whole on every rank
    grad_partition_numel: int     # stage 1/2: elements of the whole parameters touching this rank's partition


@dataclass
class Inventory(Record, name="inventory"):
    """Rank 0's tensors of at least 64 KiB, for one stage and dtype (``TensorEntry`` fields each)."""
    stage: int
    dtype: str
    tensors: list


@dataclass
class Partition(Record, name="partition"):
    """Stage 3 made visible on one rank: one weight as zero.Init partitioned it, this rank's shard,
    the whole weight inside GatheredParameters, and what is left once the gather is over."""
    rank: int
    shape: list                   # the weight's full shape (ds_shape)
    ds_numel: int                 # its elements in all
    ds_tensor_numel: int          # this rank's shard
    data_numel: int               # what .data holds outside a gather (an empty placeholder)
    status: str                   # ZeroParamStatus after zero.Init
    shard_first_values: list = field(default_factory=list)
    gathered_numel: int = 0       # elements of .data inside GatheredParameters
    shard_found_in_gathered: bool = False
    numel_after_gather: int = 0


def persistent_numel(module, stage: int, threshold: float) -> int:
    """Stage 3: elements of the parameters small enough (≤ ``threshold``) to stay whole on every rank."""
    return sum(p.ds_numel for p in module.parameters() if stage == 3 and p.ds_numel <= threshold)


def measure(stage: int, dtype: str) -> None:
    """Build, take one full step (so Adam's states exist), then measure after the next backward."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = tiny_gpt2("zero_lab")
    psi = count_parameters(model)
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
    record(ZeroMemory(stage=stage, world_size=world_size, dtype=dtype, rank=rank, num_params=psi, measured=measured,
                      accelerator=accelerator_bytes(), optimizer_class=type(engine.optimizer).__name__,
                      persistent_numel=persistent_numel(engine.module, stage, threshold),
                      grad_partition_numel=grad_partition))
    if rank == 0:
        record(Inventory(stage=stage, dtype=dtype, tensors=[vars(e) for e in inventory if e.nbytes >= 1 << 16]))
    rank0_print(f"stage {stage} {dtype}: {type(engine.optimizer).__name__:32s} "
                + "  ".join(f"{k}={v / 2**20:7.1f} MiB" for k, v in measured.items()))
    engine.step()
    release(engine)


def show_partitions() -> None:
    """Stage 3 made visible: each rank's shard of one weight, the whole weight gathered, zero.Init."""
    rank = dist.get_rank()
    config = ds_config(3, "fp32")
    with deepspeed.zero.Init(config_dict_or_path=config):    # parameters are partitioned as they are created
        model = tiny_gpt2("zero_lab")
    weight = model.transformer.h[0].mlp.c_fc.weight
    part = Partition(rank=rank, shape=list(weight.ds_shape), ds_numel=weight.ds_numel,
                     ds_tensor_numel=weight.ds_tensor.numel(), data_numel=weight.data.numel(),
                     status=str(weight.ds_status))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    shard = weight.ds_tensor
    part.shard_first_values = shard[:3].tolist()
    with deepspeed.zero.GatheredParameters(weight):           # all-gather: every rank sees the whole weight
        full = weight.data.flatten()
        start = rank * shard.numel()
        part.gathered_numel = full.numel()
        part.shard_found_in_gathered = bool(torch.equal(full[start:start + 3], shard[:3]))
    part.numel_after_gather = weight.data.numel()
    record(part)
    release(engine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--show_partitions", action="store_true", help="also show stage 3's ds_tensor, "
                        "GatheredParameters and zero.Init")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    for dtype in args.dtypes:
        for stage in args.stages:
            measure(stage, dtype)
    if args.show_partitions:
        show_partitions()
    finish()


if __name__ == "__main__":
    main()
