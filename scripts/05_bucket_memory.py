"""What a bucket size costs: ZeRO-3 engines with different reduce_bucket_size, the bytes of the
gradient bucket each one allocates, measured by walking the engine.

Run from a terminal:  deepspeed --num_gpus 2 scripts/05_bucket_memory.py --sizes 1e6 1e7
"""
import argparse
from dataclasses import dataclass

import deepspeed
import torch.distributed as dist

from course_utils.rank.engine import ds_config, forward_backward, release
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.models import tiny_gpt2
from course_utils.rank.record import Record, record
from course_utils.rank.scaffolding import finish, parse_args, rank0_print


@dataclass
class Bucket(Record, name="bucket"):
    """The buffers one rank's stage-3 engine allocated for one ``reduce_bucket_size``."""
    reduce_bucket_size: float
    dtype: str
    rank: int
    buffer_bytes: int
    model_states: dict            # model_state_bytes: params, grads, optimizer, buffers, model_states
    buffers: list                 # {"path", "numel", "nbytes"} of each buffer


def bucket_record(size: float, dtype: str, rank: int, inventory) -> Bucket:
    """The ``bucket`` record from an engine's tensor inventory: its buffers and its model states."""
    buffers = [e for e in inventory if e.category == "buffers"]
    return Bucket(reduce_bucket_size=size, dtype=dtype, rank=rank, buffer_bytes=sum(e.nbytes for e in buffers),
                  model_states=model_state_bytes(inventory),
                  buffers=[{"path": e.path, "numel": e.numel, "nbytes": e.nbytes} for e in buffers])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="reduce_bucket_size values")
    parser.add_argument("--dtype", default="bf16", help="bf16 (mixed precision, what DeepSpeed's estimators assume) or fp32")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    for size in args.sizes:
        model = tiny_gpt2("zero_lab")
        config = ds_config(3, args.dtype, reduce_bucket_size=int(size), stage3_prefetch_bucket_size=int(size))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        forward_backward(engine, 0)
        engine.step()
        forward_backward(engine, 1)           # measure where model states peak, as in notebook 03
        bucket = bucket_record(size, args.dtype, dist.get_rank(), tensor_inventory(engine))
        record(bucket)
        rank0_print(f"reduce_bucket_size {size:.0e}: buffers {[(b['path'], b['numel']) for b in bucket.buffers]}")
        engine.step()
        release(engine)
    finish()


if __name__ == "__main__":
    main()
