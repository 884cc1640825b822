"""ZeRO++ and the other axes on 4 ranks (2 simulated nodes of 2), in one launch.

1. ZeRO-3 on a small stack of blocks without and with hpZ (``zero_hpz_partition_size``): each parameter all-gather of
   one forward and backward, counted by where its bytes come from (this rank's node or the other one).
2. qwZ and qgZ (``zero_quantized_weights``, ``zero_quantized_gradients``): DeepSpeed's own message on this machine.
3. DeepSpeed-Ulysses on 4 ranks against one-rank attention.
4. The 2-stage pipeline with 2 data-parallel replicas, at ZeRO stages 0 and 1: the optimizer's bytes per rank; with
   --exercise_batch N, once more from ``train_batch_size`` N (exercise 1 of notebook 13): the micro-batches DeepSpeed
   derived and the schedule each stage ran.

Run from a terminal (on one node of 4 ranks every gather stays inside the node; the course starts 2 launchers of 2
ranks with --no_ssh, as notebook 01 does):
  deepspeed --num_gpus 4 scripts/13_zeropp.py --deepspeed_config configs/13_hpz.json
"""
import argparse
import copy
import os

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common import paths
from course_utils.rank import parallel as pp
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.parallel_comm import GatherCounter, ulysses_check
from course_utils.common.record import record
from course_utils.common.records.parallel import FromConfig, PipeZero
from course_utils.rank.scaffolding import finish, load_config, parse_args, read_config

SMALL = 64         # block width of the pipeline here: the optimizer's bytes are what is measured, not time


def zero3_step(config: dict, label: str, counter: GatherCounter | None) -> str:
    """One warm-up step, then one counted forward and backward; DeepSpeed's message if it refuses ("" if not)."""
    model = torch.nn.Sequential(*pp.layers(blocks=2, width=SMALL))
    (x, y), = pp.data(1, 1, width=SMALL, micro=2, seed=1 + dist.get_rank())
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        engine.backward(pp.mse(engine(x), y))
        engine.step()
        if counter is not None:
            counter.log.clear()
        engine.backward(pp.mse(engine(x), y))
        if counter is not None:
            shard = sum(p.ds_tensor.numel() for p in engine.module.parameters())
            record(counter.result(label, shard))
        engine.step()
    except Exception as error:       # every rank meets the same missing op at the same call
        return f"{type(error).__name__}: {error}"
    return ""


def pipeline_zero1() -> None:
    """Stage 0 and stage 1 of the pipeline engine over 2 stages × 2 replicas: the bytes this rank's optimizer holds,
    walked as notebook 03 walks them (:func:`course_utils.rank.memory.tensor_inventory`): Adam's moments, and at
    ZeRO-1 the fp32 copy of this rank's partition that DeepSpeed's ZeRO optimizer steps on."""
    config = read_config(paths.CONFIGS / "13_pipeline.json")
    for stage in (0, 1):
        engine = pp.engine(pp.layers(width=SMALL), config, 2, stage=stage)
        engine.train_batch(iter(pp.data(1, 2, width=SMALL, seed=1 + engine.grid.data_parallel_id)))
        held = model_state_bytes(tensor_inventory(engine))
        record(PipeZero(stage=stage, pipe_stage=engine.stage_id, data_parallel=engine.dp_world_size,
                        stage_parameters=sum(p.numel() for p in engine.module.parameters()),
                        optimizer_state_bytes=held["optimizer"]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exercise_batch", type=int, default=None,
                        help="also build the pipeline from train_batch_size N (DeepSpeed derives the micro-batches)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    config = load_config(args)
    deepspeed.init_distributed()
    torch.set_num_threads(1)
    per_node = int(os.environ.get("LOCAL_SIZE", dist.get_world_size()))     # the launcher's ranks on this node
    counter = GatherCounter(per_node)
    plain = copy.deepcopy(config)
    plain["zero_optimization"]["zero_hpz_partition_size"] = 1
    zero3_step(plain, "ZeRO-3", counter)
    zero3_step(config, f"ZeRO-3 + hpZ ({config['zero_optimization']['zero_hpz_partition_size']})", counter)
    counter.close()
    for key, name in (("zero_quantized_weights", "qwz"), ("zero_quantized_gradients", "qgz")):
        quantized = copy.deepcopy(plain)
        quantized["zero_optimization"][key] = True
        record(f"{name}_cpu_error", zero3_step(quantized, name, None))
    record(ulysses_check())
    pipeline_zero1()
    if args.exercise_batch:
        config = read_config(paths.CONFIGS / "13_pipeline.json")
        record(FromConfig(ranks=dist.get_world_size(), **pp.from_batch_keys(config, args.exercise_batch, width=SMALL)))
    finish()


if __name__ == "__main__":
    main()
