"""The records of notebook 03's ZeRO stages (scripts/03_zero_memory.py): model states per rank, the collectives
of one step, which slice each rank owns, gradient peaks during backward, stage 3's partitioned weight, and a few
parameters read whole (exercise 2)."""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import Record


@dataclass
class ZeroMemory(Record, name="zero_memory"):
    """What one rank's engine holds at the peak of model states, for one stage and dtype."""
    stage: int
    world_size: int
    dtype: str
    rank: int
    num_params: int
    measured: dict                # model_state_bytes: params, grads, optimizer, buffers, model_states
    accelerator: dict             # accelerator_bytes: allocated, peak
    optimizer_class: str
    persistent_numel: int         # stage 3: elements of the parameters kept whole on every rank
    grad_partition_numel: int     # stage 1/2: elements of the whole parameters touching this rank's partition
    offload: str = ""             # "", "optimizer" (offload_optimizer to the host) or "optimizer+params"


@dataclass
class YourConfig(Record, name="your_config"):
    """Rank 0's model states under a config the learner wrote (``--yours``), measured like the others."""
    stage: int
    dtype: str
    world_size: int
    num_params: int
    measured: dict                # model_state_bytes: params, grads, optimizer, buffers, model_states


@dataclass
class Comms(Record, name="comms"):
    """Rank 0's collectives during one training step (forward, backward, step), from the comms logger."""
    label: str                    # "stage 2", or a variant such as "stage 3, released after use"
    stage: int
    world_size: int
    dtype: str
    num_params: int
    owned_numel: int              # elements this rank updates: Ψ (stage 0), its flat partition (1-2), its shards (3)
    messages: dict                # op → {message bytes: count}


@dataclass
class Ownership(Record, name="ownership"):
    """Which elements of the model this rank owns at a stage, as [parameter, start, end) slices."""
    stage: int
    rank: int
    world_size: int
    params: list                  # [name, numel] in the order DeepSpeed flattens them
    slices: list                  # [name, start, end): the part of that parameter this rank owns


@dataclass
class GradPeak(Record, name="grad_peak"):
    """Gradient bytes during backward for one stage and gradient_accumulation_steps (rank 0)."""
    stage: int
    world_size: int
    gas: int
    num_params: int
    peak_grad_bytes: int          # the most gradient bytes held at any point of any backward
    peak_bucket_bytes: int        # gradient buckets (reduce_bucket_size) held at the same time, at most
    between_micro_steps: int      # gradient bytes held after a backward that does not end the cycle (gas > 1)
    partition_numel: int          # elements of the whole parameters touching this rank's partition
    bucket_numel: int             # reduce_bucket_size of the run
    peak_held_in: dict = field(default_factory=dict)   # at the peak, bytes by holder: grads_in_partition,
                                                        # all_grad_tensors (earlier micro-steps), param.grad (whole)


@dataclass
class WholeRead(Record, name="whole_read"):
    """A few parameters read after the measured step on one rank (exercise 2): stage 0's plain read is the whole
    tensor; at stage 3 the plain read sees what ``.data`` holds outside a gather, the learner's ``read_whole``
    what it gathered."""
    stage: int
    rank: int
    reader: str                   # "plain" (as PyTorch reads a module's parameter) or "yours"
    reads: dict                   # parameter name → [shape, norm], as the reader returned them


@dataclass
class Inventory(Record, name="inventory"):
    """Rank 0's tensors of at least 64 KiB, for one stage and dtype (``TensorEntry`` fields each)."""
    stage: int
    dtype: str
    tensors: list


@dataclass
class Partition(Record, name="partition"):
    """Stage 3 made visible on one rank: one weight as zero.Init partitioned it, this rank's shard,
    the whole weight inside GatheredParameters, and what is left once the gather is over."""
    rank: int
    shape: list                   # the weight's full shape (ds_shape)
    ds_numel: int                 # its elements in all
    ds_tensor_numel: int          # this rank's shard
    data_numel: int               # what .data holds outside a gather (an empty placeholder)
    status: str                   # ZeroParamStatus after zero.Init
    shard_first_values: list = field(default_factory=list)
    gathered_numel: int = 0       # elements of .data inside GatheredParameters
    shard_found_in_gathered: bool = False
    numel_after_gather: int = 0

