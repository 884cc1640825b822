"""Rank 1 raises while rank 0 waits for it in an all_reduce."""
import os
import time

import deepspeed
import torch
import torch.distributed as dist

deepspeed.init_distributed()
if dist.get_rank() == 1:
    time.sleep(1)
    raise ValueError("deliberate failure on rank 1")
t = torch.ones(1)
dist.all_reduce(t)          # rank 0 blocks here: rank 1 never arrives
time.sleep(600)
