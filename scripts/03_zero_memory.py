"""ZeRO stages 0-3 on the same GPT-2, in one launch: per-rank bytes of parameters, gradients and
optimizer states, measured by walking what each engine holds after backward (before the step); the
messages each collective sent during that step (DeepSpeed's comms logger); which slice of the model
each rank owns; with --grad_peaks, the gradient bytes at their peak *during* backward; with --regather, stage 3's
messages when parameters are released after use; with --read_whole, a few parameters read after the step (at stage 3
also by the learner's read_whole, which must gather them).

Run from a terminal:  deepspeed --num_gpus 2 scripts/03_zero_memory.py --stages 0 1 2 3 --dtypes fp32 bf16
"""
import argparse

import deepspeed
import torch
import torch.distributed as dist

from course_utils.rank import comms
from course_utils.rank.engine import accelerator_bytes, ds_config, forward_backward, release, reset_accelerator_peak
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.models import count_parameters, tiny_gpt2
from course_utils.common.record import record
from course_utils.common.records.zero import (Comms, GradPeak, Inventory, Ownership, Partition, WholeRead,
    YourConfig, ZeroMemory)
from course_utils.rank.scaffolding import finish, load_exercise, parse_args, rank0_print, read_config
from course_utils.common.zero_rules import OPTIMIZER_TO_HOST, STATES_TO_HOST   # notebook 04's offload rungs

OFFLOAD = {"": {}, "optimizer": OPTIMIZER_TO_HOST, "optimizer+params": STATES_TO_HOST}


def persistent_numel(module, stage: int, threshold: float) -> int:
    """Stage 3: elements of the parameters small enough (≤ ``threshold``) to stay whole on every rank."""
    return sum(p.ds_numel for p in module.parameters() if stage == 3 and p.ds_numel <= threshold)


def stepped_engine(config: dict):
    """The course GPT-2 under ``config`` after one full training step (so Adam's states exist): (engine, Ψ)."""
    model = tiny_gpt2("zero_lab")
    psi = count_parameters(model)                    # before stage 3 partitions the parameters
    reset_accelerator_peak()                         # on a GPU: this engine's peak CUDA bytes
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    forward_backward(engine, 0)
    engine.step()
    return engine, psi


def measure(stage: int, dtype: str, offload: str = "", reads=None) -> None:
    """Build, take one full step (so Adam's states exist), then measure after the next backward. ``offload``:
    "optimizer" (offload_optimizer to the host) or "optimizer+params" (offload_param too, stage 3). ``reads``:
    {reader: function} to run on :data:`WHOLE_READ` after the step (exercise 2; fp32, stages 0 and 3)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    config = comms.with_comms_logger(ds_config(stage, dtype, **OFFLOAD[offload]))
    engine, psi = stepped_engine(config)
    with comms.logged() as window:                   # every collective of one whole training step
        forward_backward(engine, 1)                  # model states as the step finds them: grads are held
        inventory = tensor_inventory(engine)
        engine.step()
    measured = model_state_bytes(inventory)
    grad_partition = sum(p.numel() for group in getattr(engine.optimizer, "params_in_partition", [])
                         for p in group)                         # stage 1/2: whole params touching my partition
    threshold = config["zero_optimization"].get("stage3_param_persistence_threshold", 0)
    record(ZeroMemory(stage=stage, world_size=world_size, dtype=dtype, rank=rank, num_params=psi, measured=measured,
                      accelerator=accelerator_bytes(), optimizer_class=type(engine.optimizer).__name__,
                      persistent_numel=persistent_numel(engine.module, stage, threshold),
                      grad_partition_numel=grad_partition, offload=offload))
    rank0_print(f"stage {stage}{' + offload ' + offload if offload else ''} {dtype}: {type(engine.optimizer).__name__:32s} "
                + "  ".join(f"{k}={v / 2**20:7.1f} MiB" for k, v in measured.items()))
    if offload:         # the offload runs add where the states live, nothing to the comms and inventory views
        release(engine)
        return
    if rank == 0:
        record(Inventory(stage=stage, dtype=dtype, tensors=[vars(e) for e in inventory if e.nbytes >= 1 << 16]))
    if rank == 0:
        record(Comms(label=f"stage {stage}", stage=stage, world_size=world_size, dtype=dtype, num_params=psi,
                     owned_numel=owned_numel(engine, stage, psi), messages=window.messages))
    if dtype == "fp32":
        record(ownership(engine, stage))
        if reads and stage in (0, 3):
            record_reads(engine, stage, reads)
    release(engine)


def owned_numel(engine, stage: int, psi: int) -> int:
    """Elements this rank updates in the optimizer step: all (stage 0), its flat partition (1-2), its shards (3)."""
    if stage == 0:
        return psi
    if stage == 3:
        return sum(p.ds_tensor.numel() for p in engine.module.parameters())
    return sum(engine.optimizer.partition_size)


def ownership(engine, stage: int) -> Ownership:
    """This rank's slices of the model: stage 1-2 own one contiguous range of the flattened parameters
    (``partition_size`` elements from ``rank × partition_size``), stage 3 a slice of every parameter
    (its ``ds_tensor``), except the persistent ones it holds whole; stage 0 owns everything."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    names = {id(p): n for n, p in engine.module.named_parameters()}
    if stage in (1, 2):
        ordered = [p for group in engine.optimizer.bit16_groups for p in group]
    else:
        ordered = list(engine.module.parameters())
    numel = (lambda p: p.ds_numel) if stage == 3 else (lambda p: p.numel())
    params = [[names[id(p)], numel(p)] for p in ordered]
    slices = []
    if stage in (0, 3):
        for p in ordered:
            if stage == 0 or p.ds_persist:
                slices.append([names[id(p)], 0, numel(p)])
            else:
                shard = p.ds_tensor.numel()
                start = min(rank * shard, p.ds_numel)
                slices.append([names[id(p)], start, min(start + shard, p.ds_numel)])
    else:
        size = engine.optimizer.partition_size[0]
        lo, hi, offset = rank * size, (rank + 1) * size, 0
        for p in ordered:
            start, end = max(lo, offset), min(hi, offset + p.numel())
            if start < end:
                slices.append([names[id(p)], start - offset, end - offset])
            offset += p.numel()
    return Ownership(stage=stage, rank=rank, world_size=world_size, params=params, slices=slices)


# Exercise 2 reads these after the measured step: the tied token embedding and one MLP weight (partitioned by
# stage 3) and a LayerNorm weight (small enough to stay whole on every rank: persistent).
WHOLE_READ = ("transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.ln_1.weight")


def plain_read(params: dict) -> dict:
    """Each parameter's (shape, norm) as plain PyTorch reads it: the whole tensor at stage 0; at stage 3 whatever
    ``.data`` holds outside a gather. Stage 0's reads are what exercise 2's are compared with."""
    return {name: (tuple(p.shape), float(p.detach().norm())) for name, p in params.items()}


def record_reads(engine, stage: int, reads: dict) -> None:
    """Call each reader on :data:`WHOLE_READ` on every rank and record what it returned (a reader that gathers
    needs every rank to take part). The learner's reader runs at stage 3 only."""
    params = {name: p for name, p in engine.module.named_parameters() if name in WHOLE_READ}
    for reader, read in reads.items():
        if reader == "plain" or stage == 3:
            record(WholeRead(stage=stage, rank=dist.get_rank(), reader=reader, reads=read(params)))


# Stage 3 knobs that release every gathered parameter right after its use: no reuse distance, no prefetch
# (a parameter the prefetcher fetched ahead is kept: PartitionedParameterCoordinator.__params_to_release).
RELEASE_AFTER_USE = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}


def regather_comms(dtype: str) -> None:
    """Stage 3 once more with :data:`RELEASE_AFTER_USE`: parameters are released after their forward use
    and gathered again in backward. (With the course config's large reuse distance and prefetch bucket,
    forward gathers every parameter at once and backward finds them still there.)"""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    engine, psi = stepped_engine(comms.with_comms_logger(ds_config(3, dtype, **RELEASE_AFTER_USE)))
    with comms.logged() as window:
        forward_backward(engine, 1)
        engine.step()
    if rank == 0:
        record(Comms(label="stage 3, released after use", stage=3, world_size=world_size, dtype=dtype, num_params=psi,
                     owned_numel=owned_numel(engine, 3, psi), messages=window.messages))
    release(engine)


def gradient_bytes(engine) -> tuple[int, int, dict]:
    """(gradient bytes, gradient-bucket bytes, gradient bytes by where they are held) the engine holds now, by
    walking its tensors. Where: the ZeRO optimizer's partition buffer of this backward (``grads_in_partition``),
    its sum of the earlier micro-steps (``all_grad_tensors``), or whole ``param.grad`` tensors not reduced yet."""
    inventory = tensor_inventory(engine)
    optimizer = engine.optimizer
    held_in = {}
    if getattr(optimizer, "grads_in_partition", None) is not None:
        held_in[optimizer.grads_in_partition.untyped_storage().data_ptr()] = "grads_in_partition"
    for grads in (getattr(optimizer, "all_grad_tensors", None) or {}).values():
        for g in grads or []:
            held_in[g.untyped_storage().data_ptr()] = "all_grad_tensors"
    where = {}
    for e in inventory:
        if e.category == "grads":
            label = held_in.get(e.storage, "param.grad")
            where[label] = where.get(label, 0) + e.nbytes
    return (sum(e.nbytes for e in inventory if e.category == "grads"),
            sum(e.nbytes for e in inventory if e.category == "buffers" and "bucket" in e.path), where)


def grad_peak(stage: int, gas: int, bucket: float = 1e6) -> None:
    """Sample the gradient bytes after every transformer block's backward, just before the engine reduces,
    and after each backward, over two accumulation cycles; record the peak (rank 0)."""
    model = tiny_gpt2("zero_lab")
    psi = count_parameters(model)
    config = ds_config(stage, "fp32", reduce_bucket_size=bucket)
    config["gradient_accumulation_steps"] = gas
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    samples, between = [], 0
    for block in engine.module.transformer.h:
        block.register_full_backward_hook(lambda *_: samples.append(gradient_bytes(engine)))
    reduce = engine.allreduce_gradients

    def sampled_reduce(*args, **kwargs):              # the moment every gradient exists, none reduced yet
        samples.append(gradient_bytes(engine))
        return reduce(*args, **kwargs)

    engine.allreduce_gradients = sampled_reduce
    for micro in range(2 * gas):
        forward_backward(engine, micro)
        samples.append(gradient_bytes(engine))
        if not engine.is_gradient_accumulation_boundary():
            between = max(between, samples[-1][0])
        engine.step()
    partition = sum(p.numel() for group in getattr(engine.optimizer, "params_in_partition", []) for p in group)
    if dist.get_rank() == 0:
        peak = max(samples, key=lambda s: s[0])
        record(GradPeak(stage=stage, world_size=dist.get_world_size(), gas=gas, num_params=psi,
                        peak_grad_bytes=peak[0], peak_bucket_bytes=max(s[1] for s in samples),
                        between_micro_steps=between, partition_numel=partition, bucket_numel=int(bucket),
                        peak_held_in=peak[2]))
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


def measure_yours(path: str) -> None:
    """The learner's config as written: the same model, step and measuring point as :func:`measure`."""
    engine, psi = stepped_engine(read_config(path))
    forward_backward(engine, 1)
    measured = model_state_bytes(tensor_inventory(engine))
    dtype = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
    if dist.get_rank() == 0:
        record(YourConfig(stage=engine.zero_optimization_stage(), dtype=dtype, world_size=dist.get_world_size(),
                          num_params=psi, measured=measured))
    rank0_print(f"your config: stage {engine.zero_optimization_stage()} {dtype}: "
                + "  ".join(f"{k}={v / 2**20:7.1f} MiB" for k, v in measured.items()))
    release(engine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", type=int, nargs="*", default=[0, 1, 2, 3])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--bf16_stages", type=int, nargs="*", default=None,
                        help="the stages measured in bf16 (default: --stages); bf16 is emulated on CPU, hence slow")
    parser.add_argument("--show_partitions", action="store_true", help="also show stage 3's ds_tensor, "
                        "GatheredParameters and zero.Init")
    parser.add_argument("--regather", action="store_true", help="also stage 3 with parameters released after use")
    parser.add_argument("--grad_peaks", action="store_true", help="also the gradient bytes during backward, "
                        "stages 1-2, gradient_accumulation_steps 1 and 2")
    parser.add_argument("--yours", help="also a config file of your own, measured the same way")
    parser.add_argument("--read_whole", nargs="?", const="", default=None, metavar="FILE",
                        help="record the plain read of a few parameters' shape and norm after the fp32 step at stages 0 "
                        "and 3; with FILE, also its read_whole(params) at stage 3 (exercise 2)")
    parser.add_argument("--offload", action="store_true", help="also stage 2 + offload_optimizer and stage 3 + "
                        "offload_optimizer + offload_param (to the host), in the first dtype")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    reads = None if args.read_whole is None else {"plain": plain_read}
    if args.read_whole:
        reads["yours"] = load_exercise(args.read_whole, ["read_whole"])["read_whole"]
    for dtype in args.dtypes:
        for stage in args.stages if dtype != "bf16" or args.bf16_stages is None else args.bf16_stages:
            measure(stage, dtype, reads=reads)
    if args.offload:
        measure(2, args.dtypes[0], "optimizer")
        measure(3, args.dtypes[0], "optimizer+params")
    if args.yours:
        measure_yours(args.yours)
    if args.regather:
        regather_comms(args.dtypes[0])
    if args.grad_peaks:
        for stage in (1, 2):
            for gas in (1, 2):
                grad_peak(stage, gas)
    if args.show_partitions:
        show_partitions()
    finish()


if __name__ == "__main__":
    main()
