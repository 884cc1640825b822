"""A rank of notebook 16 on a GPU whose capped CUDA allocator refuses the next size: it records the attempt, as
scripts/16_bigger_than_your_device.py does, then raises the error PyTorch's CUDA allocator raises past
``set_per_process_memory_fraction`` (its type and its message's opening words), for the runner tests of a GPU machine."""
import deepspeed
import torch

from course_utils.common.record import record
from course_utils.common.records.bigger import Attempt
from course_utils.rank.scaffolding import parse_args

parse_args()
deepspeed.init_distributed()
record(Attempt("no ZeRO", "25 M", 25_000_000, 786_432))
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of 79.19 GiB "
                             "of which 78.31 GiB is free. Of the allocated memory 301.52 MiB is allocated by PyTorch")
