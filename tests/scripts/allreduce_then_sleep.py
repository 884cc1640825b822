"""Every rank does one all_reduce through DeepSpeed's comm, records it, then hangs.

On CPU, DeepSpeed's comm backend sets up its shared-memory all-reduce, which creates
/dev/shm/deepspeed_allreduce_buffer_<uid>_127.0.0.1_<port>_<rank> (about 66 MB per rank): the runner
tests use this script to check that those buffers go away with the launch, however it ends.
"""
import time

import deepspeed
import deepspeed.comm as dist
import torch

from course_utils.common.record import record

deepspeed.init_distributed()
t = torch.ones(8)
dist.all_reduce(t)
record("sum", t[0].item())
while True:
    time.sleep(1)
