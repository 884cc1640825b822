"""A learner's plain script: no course imports and no finish(); it returns after one all_reduce. With
``--destroy`` it ends its process group first, as a script launched without the course's rank hook must
(tests/test_own_scripts.py)."""
import sys

import deepspeed
import torch
import torch.distributed as dist

deepspeed.init_distributed()
t = torch.tensor([1.0])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: sum {t.item()}")
if "--destroy" in sys.argv:
    dist.destroy_process_group()
