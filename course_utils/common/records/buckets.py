"""The records of notebook 05's bucket measurements (scripts/05_bucket_memory.py)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class Bucket(Record, name="bucket"):
    """The gradient buckets one rank's engine allocated for one case, at their largest."""
    reduce_bucket_size: float
    dtype: str
    rank: int
    buffer_bytes: int             # bytes of the buckets at their largest (stages 1-2: during backward)
    model_states: dict            # model_state_bytes after backward: params, grads, optimizer, buffers, model_states
    buffers: list                 # {"path", "numel", "nbytes"} of each bucket, where buffer_bytes was measured
    stage: int = 3
    overlap_comm: bool | None = None           # as the engine resolved them (None: not asked)
    contiguous_gradients: bool | None = None
    allgather_bucket_size: float | None = None
    held_bytes: int | None = None              # bucket bytes still allocated after backward
    case: dict | None = None                   # the case as the launch asked for it

