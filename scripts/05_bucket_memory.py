"""What a bucket size costs: ZeRO-3 engines with different reduce_bucket_size, the bytes of the
gradient bucket each one allocates, measured by walking the engine.

Run from a terminal:  deepspeed --num_gpus 2 scripts/05_bucket_memory.py --sizes 1e6 1e7
"""
import argparse

import deepspeed
import torch.distributed as dist

from course_utils import record
from course_utils.memory import model_state_bytes, tensor_inventory
from course_utils.scripting import finish, parse_args, rank0_print
from course_utils.zero_lab import build_model, ds_config, forward_backward, release

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="reduce_bucket_size values")
parser.add_argument("--dtype", default="bf16", help="bf16 (mixed precision, what DeepSpeed's estimators assume) or fp32")
args = parse_args(parser)
deepspeed.init_distributed()
dtype = args.dtype

for size in args.sizes:
    model = build_model()
    config = ds_config(3, dtype, reduce_bucket_size=int(size), stage3_prefetch_bucket_size=int(size))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    forward_backward(engine, 0)
    engine.step()
    forward_backward(engine, 1)           # measure where model states peak, as in notebook 03
    inventory = tensor_inventory(engine)
    buffers = [e for e in inventory if e.category == "buffers"]
    record("bucket", {"reduce_bucket_size": size, "dtype": dtype, "rank": dist.get_rank(),
                      "buffer_bytes": sum(e.nbytes for e in buffers), "model_states": model_state_bytes(inventory),
                      "buffers": [{"path": e.path, "numel": e.numel, "nbytes": e.nbytes} for e in buffers]})
    rank0_print(f"reduce_bucket_size {size:.0e}: buffers {[(e.path, e.numel) for e in buffers]}")
    engine.step()
    release(engine)
finish()
