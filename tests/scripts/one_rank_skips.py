"""Rank 0 waits in an all_reduce that rank 1 never reaches (rank 1 waits for data instead): a hang, which
the runner's timeout ends after taking every rank's stack. (torch.distributed alone: ranks get there fast.)"""
import time

import torch
import torch.distributed as dist


def wait_for_data():
    while True:
        time.sleep(0.2)


dist.init_process_group("gloo")      # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from the deepspeed launcher
print(f"rank {dist.get_rank()} reached its wait", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4))
else:
    wait_for_data()
