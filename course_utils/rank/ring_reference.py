"""The course's own ring all-reduce, which scripts/01_ring.py runs while notebook 01's exercise is not written, so
that the cells after it still have a ring to measure and draw. It is the exercise's answer: no notebook imports
this module (tests/test_repo.py holds to that)."""
from __future__ import annotations

from typing import Any


def course_ring_all_reduce(tensor: Any) -> Any:
    """The course's ring all-reduce, in place: N−1 scatter-reduce steps, then N−1 all-gather steps, each rank
    sending to its right neighbour and receiving from its left. The ranks run it while the learner's is not written,
    so the cells after the exercise still have a ring to measure and draw."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.chunk(world))          # views: writing a chunk writes the tensor
    right, left = (rank + 1) % world, (rank - 1) % world
    buffer = torch.empty_like(chunks[0])
    for phase in ("scatter-reduce", "all-gather"):
        for step in range(world - 1):
            shift = 0 if phase == "scatter-reduce" else 1
            send_i, recv_i = (rank - step + shift) % world, (rank - step - 1 + shift) % world
            request = dist.isend(chunks[send_i].contiguous(), right)
            dist.recv(buffer, left)
            request.wait()
            if phase == "scatter-reduce":
                chunks[recv_i] += buffer
            else:
                chunks[recv_i].copy_(buffer)
    return tensor
