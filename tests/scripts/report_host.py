"""Each rank says which host it was started on and all-reduces rank + 1, for the multi-node tests (torch.distributed
alone, so the ranks start fast). ``--fail_rank N``: rank N raises while the others wait outside any collective
(only the launcher can tell them); ``--hang``: every rank waits forever after the all_reduce."""
import argparse
import time

import torch
import torch.distributed as dist

from course_utils.rank.distributed import rank_identity
from course_utils.common.record import record
from course_utils.rank.scaffolding import finish

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)
parser.add_argument("--fail_rank", type=int, default=None)
parser.add_argument("--hang", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")      # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the deepspeed launcher
identity = rank_identity()
print(f"rank {identity.rank} started on {identity.ssh_host}", flush=True)
if args.fail_rank is not None:
    if identity.rank == args.fail_rank:
        raise ValueError(f"deliberate failure on rank {identity.rank}")
    while True:
        time.sleep(0.2)
t = torch.tensor([identity.rank + 1.0])
dist.all_reduce(t)
record(identity)
record("sum", t.item())
while args.hang:
    time.sleep(0.2)
finish()
