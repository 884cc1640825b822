"""Records rank facts, for runner tests (parallel launches, simulated nodes)."""
import os

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common.record import record
from course_utils.rank.scaffolding import finish, parse_args

args = parse_args()
deepspeed.init_distributed()
t = torch.tensor([1.0])
dist.all_reduce(t)
record("world", {"rank": dist.get_rank(), "local_rank": int(os.environ["LOCAL_RANK"]),
                 "world_size": dist.get_world_size(), "sum": t.item(), "pid": os.getpid(),
                 "config": args.deepspeed_config})
finish()
