"""What a bucket size costs: ZeRO engines of the course model built with different bucket settings,
and the gradient buckets each one really allocates, measured by walking the engine (the tensor walk of
notebook 03).

Stages 1 and 2 allocate their gradient buckets when backward starts (``setup_buckets``, called from the
gradient hooks) and free them when it ends (``_release_ipg_buffers``): the script wraps ``setup_buckets``
so that it can walk the engine right after the allocation, while the buckets exist. Stage 3 allocates
its bucket once, when the optimizer is built, and keeps it: it is walked after backward.

Each case is a JSON object: {"stage": 1|2|3, "dtype": "bf16"|"fp32", "reduce_bucket_size": ..., plus any
other zero_optimization key (overlap_comm, contiguous_gradients, allgather_bucket_size, ...)}.
The first stage-3 case also takes an optimizer step and a second backward, so that its model states are
measured where they peak (as in notebook 03).

Run from a terminal:
  deepspeed --num_gpus 2 scripts/05_bucket_memory.py \
      --cases '{"stage": 2, "dtype": "bf16", "reduce_bucket_size": 1e6, "overlap_comm": true}'
"""
import argparse
import json

import deepspeed
import torch.distributed as dist

from course_utils.rank.engine import ds_config, forward_backward, release
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.models import tiny_gpt2
from course_utils.common.record import record
from course_utils.common.records.buckets import Bucket
from course_utils.rank.scaffolding import finish, parse_args, rank0_print

DEFAULT_CASES = [{"stage": 3, "dtype": "bf16", "reduce_bucket_size": 1e6},
                 {"stage": 2, "dtype": "bf16", "reduce_bucket_size": 1e6, "overlap_comm": True}]


def bucket_bytes(inventory) -> int:
    return sum(e.nbytes for e in inventory if e.category == "buffers")


def bucket_record(size: float, dtype: str, rank: int, inventory, during=None, **settings) -> Bucket:
    """The ``bucket`` record from an engine's tensor inventory after backward (``inventory``) and, for
    stages 1-2, the inventory taken while backward held its buckets (``during``): the larger counts."""
    largest = max([inventory] + ([during] if during is not None else []), key=bucket_bytes)
    buffers = [e for e in largest if e.category == "buffers"]
    return Bucket(reduce_bucket_size=size, dtype=dtype, rank=rank, buffer_bytes=bucket_bytes(largest),
                  model_states=model_state_bytes(inventory),
                  buffers=[{"path": e.path, "numel": e.numel, "nbytes": e.nbytes} for e in buffers],
                  held_bytes=bucket_bytes(inventory), **settings)


def watch_buckets(engine) -> dict:
    """Wrap the ZeRO 1/2 optimizer's ``setup_buckets``: the first time it allocates the buckets of a
    backward pass, walk the engine. Returns a dict whose "during" entry holds that inventory."""
    optimizer = engine.optimizer
    seen = {"during": None}
    if not hasattr(optimizer, "setup_buckets"):      # stage 3 has no such method: its bucket is permanent
        return seen
    original = optimizer.setup_buckets

    def setup_buckets():
        allocating = not optimizer.ready_for_gradients
        original()
        if allocating and seen["during"] is None:
            seen["during"] = tensor_inventory(engine)

    optimizer.setup_buckets = setup_buckets
    return seen


def measure(case: dict, peak_states: bool) -> Bucket:
    """Build the engine of ``case``, run backward (and, if ``peak_states``, a step and a second backward)."""
    zero = {k: v for k, v in case.items() if k not in ("stage", "dtype")}
    for key in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size"):
        if key in zero:
            zero[key] = int(zero[key])
    model = tiny_gpt2("zero_lab")
    config = ds_config(case["stage"], case["dtype"], **zero)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    seen = watch_buckets(engine)
    forward_backward(engine, 0)
    if peak_states:
        engine.step()
        forward_backward(engine, 1)           # measure where model states peak, as in notebook 03
    bucket = bucket_record(engine.zero_reduce_bucket_size(), case["dtype"], dist.get_rank(), tensor_inventory(engine),
                           during=seen["during"], stage=engine.zero_optimization_stage(),
                           overlap_comm=engine.zero_overlap_comm(),
                           contiguous_gradients=engine.zero_contiguous_gradients(),
                           allgather_bucket_size=engine.zero_allgather_bucket_size(), case=case)
    release(engine)
    return bucket


def case_arg(text: str) -> dict:
    """One ``--cases`` value: a JSON object with a stage (1-3), a dtype and zero_optimization keys."""
    try:
        case = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r} ({e})") from None
    if not isinstance(case, dict) or case.get("stage") not in (1, 2, 3) or case.get("dtype") not in ("bf16", "fp32"):
        raise argparse.ArgumentTypeError(f"{text!r}: a case needs \"stage\": 1, 2 or 3 and \"dtype\": \"bf16\" or \"fp32\"")
    return case


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=case_arg, nargs="+", default=DEFAULT_CASES,
                        help="one JSON object per engine: stage, dtype and zero_optimization keys")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    record("all_gather_into_tensor", deepspeed.comm.has_all_gather_into_tensor())   # what all_gather_dp_groups uses instead of buckets
    first_stage3 = next((i for i, c in enumerate(args.cases) if c["stage"] == 3), None)
    for i, case in enumerate(args.cases):
        bucket = measure(case, peak_states=i == first_stage3)
        record(bucket)
        # the buckets go to the records only: notebook 05 has some of them predicted before it shows them
        rank0_print(f"{json.dumps(case)}: model states {bucket.model_states['model_states'] / 2**20:.1f} MiB, buckets recorded")
    finish()


if __name__ == "__main__":
    main()
