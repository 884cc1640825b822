"""Rank 1 aborts (SIGABRT, as a failed C++ check in gloo does) while rank 0 waits for it in an all_reduce: rank 0
then dies of a Python error that only says the peer went away. (torch.distributed alone: ranks get there fast.)"""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")      # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the deepspeed launcher
dist.barrier()
if dist.get_rank() == 1:
    print("rank 1 aborts", flush=True)
    os.abort()
dist.all_reduce(torch.ones(4))
