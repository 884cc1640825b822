"""Pipeline, sequence and tensor parallelism on 2 ranks, in one launch.

1. A stack of 8 equal blocks as a ``deepspeed.pipe.PipelineModule`` over 2 stages, trained with
   ``engine.train_batch()`` for each number of micro-batches m: every instruction each stage executes, timed
   (the bubble), counted per schedule step, and the bytes its sends moved.
2. The same model on one rank (plain PyTorch, the same AdamW, the same batches): the losses side by side.
3. ZeRO-2 asked of the pipeline engine: DeepSpeed's own refusal.
4. A layer list with a frozen base, partitioned "uniform" and "parameters": parameters per stage, all and trainable.
   With --partitions_only --yours FILE, only that, and also as your ``build_pipeline`` partitions it (exercise 2).
   With --exercise_batch N: the pipeline once more from the config with ``train_batch_size`` N instead of
   ``gradient_accumulation_steps`` (exercise 1): the micro-batches DeepSpeed derived and the schedule each stage ran.
5. DeepSpeed-Ulysses' DistributedAttention against one-rank attention, with its all-to-all bytes.
6. AutoTP (``tensor_parallel``) on the course's GPT-2 and on a tiny Llama.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/13_pipeline.py --deepspeed_config configs/13_pipeline.json
"""
import argparse
import contextlib
import io
import statistics

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import PipelineModule

from course_utils.rank import parallel as pp
from course_utils.rank.models import tiny_gpt2
from course_utils.rank.parallel_comm import autotp, tiny_llama, ulysses_check
from course_utils.common.record import record
from course_utils.common.records.parallel import Bubble, FromConfig, Partition, PipeLosses, StageBytes, StageStream
from course_utils.rank.scaffolding import finish, load_config, load_exercise, parse_args, rank0_print

LOSS_M = 4         # micro-batches of the run compared with one rank


def sweep(config: dict, ms: list, batches: int) -> list:
    """Each m: ``batches`` timed train_batch calls (the first one warms up); records per stage."""
    losses = []
    for m in ms:
        engine = pp.engine(pp.layers(), config, m)
        trace = pp.instrument(engine)
        data = iter(pp.data(batches, m))
        measured = [pp.measure_batch(engine, trace, data) for _ in range(batches)]
        stage = engine.stage_id
        shares = [idle for _, (idle, _, _) in measured[1:]]
        _, busy, window = measured[-1][1]
        record(Bubble(m=m, stages=2, stage=stage, idle_share=statistics.median(shares), shares=shares,
                      busy_ms=busy, window_ms=window, idle_steps=trace.idle_steps(), steps=len(trace.steps),
                      in_flight=trace.in_flight(), by_instruction=trace.by_instruction()))
        record(StageStream(m=m, stage=stage, executed=[[*s] for s in _executed(trace)], durations=trace.durations()))
        record(StageBytes(m=m, stage=stage, sent=dict(trace.sent), activation_shape=[pp.MICRO, pp.WIDTH],
                          element_bytes=4))
        if m == LOSS_M:
            losses = [loss for loss, _ in measured]
            record("pipeline_optimizer", type(engine.optimizer).__name__)
        rank0_print(f"m={m}: stage {stage} idle {statistics.median(shares):.1%} of the window")
    return losses


def _executed(trace) -> list:
    """The executed instructions of the last batch, grouped by schedule step, as DeepSpeed writes them."""
    out, names = [], iter(trace.executed())
    for step in trace.steps:
        out.append([next(names) for _ in step])
    return out


def one_rank(config: dict, batches: int) -> list:
    """The same layers on this rank alone: each batch's m micro-batches as one batch, torch's AdamW."""
    model = torch.nn.Sequential(*pp.layers())
    opt = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                                  weight_decay=opt["weight_decay"])
    data = pp.data(batches, LOSS_M)
    losses = []
    for b in range(batches):
        chunk = data[b * LOSS_M:(b + 1) * LOSS_M]
        loss = pp.mse(model(torch.cat([x for x, _ in chunk])), torch.cat([y for _, y in chunk]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def refused(config: dict, stage: int) -> str:
    """DeepSpeed's message when the pipeline engine is asked for ZeRO ``stage`` ("" if it accepts it)."""
    try:
        pp.engine(pp.layers(), config, 2, stage=stage)
    except AssertionError as error:
        return f"AssertionError: {error}"
    return ""


def partitions(yours) -> None:
    """Parameters per stage (all, and trainable) of the layer list with a frozen base: "uniform", "parameters" (as
    the colleague asked), and as you partition it."""
    from course_utils.rank.parallel import frozen_base_layers, stage_parameters

    given: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        pipes = {label: PipelineModule(layers=given.setdefault(label, frozen_base_layers()), num_stages=2,
                                       loss_fn=pp.mse, partition_method=method)
                 for label, method in (("uniform", "uniform"), ("parameters (as given)", "parameters"))}
        if yours:
            pipes["yours"] = yours(given.setdefault("yours", frozen_base_layers()), 2, pp.mse)
    for label, pipe in pipes.items():
        counts, trainable = stage_parameters(pipe)
        # the layers the pipeline runs, in its order, against the list it was given (the same objects)
        in_order = [id(layer) for layer in pipe._layer_specs] == [id(layer) for layer in given[label]]
        record(Partition(label=label, parameters=counts, trainable=trainable, in_order=in_order,
                         layers=[pipe.parts[s + 1] - pipe.parts[s] for s in range(pipe.num_stages)]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--batches", type=int, default=8, help="train_batch calls per m (the first warms up)")
    parser.add_argument("--exercise_batch", type=int, default=None,
                        help="also build the pipeline from train_batch_size N (DeepSpeed derives the micro-batches)")
    parser.add_argument("--partitions_only", action="store_true", help="only the partitions of the frozen-base model")
    parser.add_argument("--yours", default=None, help="a file defining build_pipeline(layers, num_stages, loss_fn)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    config = load_config(args)
    deepspeed.init_distributed()
    torch.set_num_threads(1)          # one core per rank: a waiting stage leaves its core to the other one
    yours = load_exercise(args.yours, ["build_pipeline"]).get("build_pipeline") if args.yours else None
    if args.partitions_only:
        partitions(yours)
        return finish()
    pipe_losses = sweep(config, args.micro_batches, args.batches)
    if args.exercise_batch:
        record(FromConfig(ranks=dist.get_world_size(), **pp.from_batch_keys(config, args.exercise_batch)))
    record(PipeLosses(label="pipeline, 2 stages", losses=pipe_losses))
    if dist.get_rank() == 0:
        record(PipeLosses(label="one rank", losses=one_rank(config, args.batches)))
    record("pipeline_zero1_error", refused(config, 1))
    record("pipeline_zero2_error", refused(config, 2))
    partitions(yours)
    record(ulysses_check())
    record(autotp("GPT-2 (the course's)", tiny_gpt2("checkpoints"), dist.get_world_size()))
    record(autotp("Llama (tiny, from a config)", tiny_llama(), dist.get_world_size()))
    finish()


if __name__ == "__main__":
    main()
