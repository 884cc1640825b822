"""A learner's plain script: no course imports and no finish(); it returns after one all_reduce."""
import deepspeed
import torch
import torch.distributed as dist

deepspeed.init_distributed()
t = torch.tensor([1.0])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: sum {t.item()}")
