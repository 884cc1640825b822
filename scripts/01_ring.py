"""Ring all-reduce written from send/recv (the notebook's exercise), checked against dist.all_reduce,
with the bytes each rank sent counted.

Run from a terminal:  deepspeed --num_gpus 2 scripts/01_ring.py --ring_file build/exercises/ring.py
"""
import argparse
import importlib.util

import deepspeed
import torch
import torch.distributed as dist

from course_utils import record
from course_utils.distributed import choose_device, count_sent_bytes, rank_identity, ring_bytes_expected
from course_utils.scripting import finish, parse_args

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--ring_file", required=True, help="file defining ring_all_reduce(tensor) (checks.export_function)")
parser.add_argument("--elements", type=int, default=1 << 16, help="float32 elements in the tensor to reduce")
parser.add_argument("--cpu", action="store_true", help="CPU tensors over gloo even on a GPU machine "
                    "(for nodes simulated on one machine, whose ranks would share GPUs)")
args = parse_args(parser)

spec = importlib.util.spec_from_file_location("ring_exercise", args.ring_file)
ring_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ring_module)

identity = rank_identity()
device, backend = choose_device(identity["local_rank"], identity["local_size"], cpu=args.cpu)
deepspeed.init_distributed(dist_backend=backend)
rank, world = dist.get_rank(), dist.get_world_size()

generator = torch.Generator().manual_seed(rank)
data = torch.randn(args.elements, generator=generator).to(device)
reference = data.clone()
dist.all_reduce(reference)

mine = data.clone()
with count_sent_bytes() as sent:
    result = ring_module.ring_all_reduce(mine)
result = mine if result is None else result

size = data.numel() * data.element_size()
matches = bool(torch.allclose(result, reference, rtol=1e-5, atol=1e-5))
print(f"rank {rank}: ring == all_reduce: {matches}, max |diff| {float((result - reference).abs().max()):.2e}, "
      f"sent {sent['bytes']} bytes in {sent['messages']} messages "
      f"(2(N-1)/N·S = {ring_bytes_expected(size, world):.0f})")
record("ring", {"rank": rank, "matches": matches, "max_abs_diff": float((result - reference).abs().max()),
                "bytes_sent": sent["bytes"], "messages": sent["messages"], "tensor_bytes": size,
                "expected_bytes": ring_bytes_expected(size, world), "world_size": world})
finish()
