"""Notebook 13's records: the pipeline (``scripts/13_pipeline.py``), ZeRO++ (``scripts/13_zeropp.py``), Ulysses and
AutoTP (built in :mod:`course_utils.rank.parallel` and :mod:`course_utils.rank.parallel_comm`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import Record


@dataclass
class Bubble(Record, name="pipeline_bubble_row"):
    """One stage's idle share of a ``train_batch`` of ``m`` micro-batches (median over batches)."""
    m: int
    stages: int
    stage: int
    idle_share: float            # 1 − (forward + backward time) / pipeline window: median over the timed batches
    shares: list                 # the same for each timed batch, in order (the last one's stream is recorded)
    busy_ms: float
    window_ms: float
    idle_steps: int              # schedule steps in which this stage ran no forward or backward pass
    steps: int                   # schedule steps of the batch: 2 (m + p − 1)
    in_flight: int               # most micro-batches whose activations this stage held at once
    by_instruction: dict         # milliseconds spent in each instruction type (one batch)


@dataclass
class FromConfig(Record, name="pipeline_from_config"):
    """Exercise 1's pipeline on one rank: built from a config's ``train_batch_size`` and micro-batch, the micro-batches
    DeepSpeed derived (``m``) and the schedule steps this stage executed without a forward or backward pass."""
    ranks: int
    data_parallel: int
    stage: int
    train_batch_size: int
    micro_batch: int
    m: int
    idle_steps: int
    steps: int


@dataclass
class StageStream(Record, name="pipeline_stream"):
    """The instructions one stage executed in one ``train_batch`` (names and buffer ids), step by step."""
    m: int
    stage: int
    executed: list
    durations: list              # milliseconds of each executed instruction, in order


@dataclass
class StageBytes(Record, name="pipeline_p2p_bytes"):
    """What one stage sent to its neighbour in one ``train_batch``, by instruction."""
    m: int
    stage: int
    sent: dict                   # instruction → bytes
    activation_shape: list       # (micro-batch, width): the tensor crossing the stage boundary
    element_bytes: int


@dataclass
class PipeZero(Record, name="pipeline_zero_state"):
    """One rank of a pipeline with data-parallel replicas: what its optimizer holds at a ZeRO stage."""
    stage: int
    pipe_stage: int
    data_parallel: int
    stage_parameters: int
    optimizer_state_bytes: int   # what the rank's optimizer holds: its moments and, at ZeRO ≥ 1, its fp32 copy of the partition


@dataclass
class Partition(Record, name="pipeline_partition"):
    """The parameters each stage of a ``PipelineModule`` holds, for the partition ``label``."""
    label: str
    layers: list                 # layers per stage
    parameters: list             # parameters per stage, frozen or not
    trainable: list              # of which trainable (requires_grad)
    in_order: bool = True        # whether the pipeline holds the layers it was given, each once, in their order


@dataclass
class PipeLosses(Record, name="pipeline_losses"):
    label: str
    losses: list = field(default_factory=list)


@dataclass
class Ulysses(Record, name="ulysses_attention"):
    p: int
    max_abs_diff: float          # this rank's output against whole-sequence attention on one rank
    local_shape: list            # what the local attention saw: (batch, whole sequence, heads / p, head dim)
    forward_alltoall: dict       # message bytes → count, forward pass
    backward_alltoall: dict      # message bytes → count, backward pass
    shape: list                  # (batch, sequence, heads, head dim) of q, k and v, whole
    element_bytes: int


@dataclass
class TensorParallel(Record, name="autotp"):
    model: str
    error: str                   # DeepSpeed's own message ("" when it ran)
    split: dict                  # weight name → [whole shape, this rank's shape] (the weights it split)
    kept: list                   # weights it kept whole on every rank
    rank_bytes: int              # this rank's parameter bytes
    whole_bytes: int             # the unsplit model's
    max_abs_diff: float          # logits against the unsplit model's (-1 when it did not run)


@dataclass
class Gathers(Record, name="hpz_gathers"):
    label: str
    intra_node: int              # bytes this rank received from ranks of its own node, one forward + backward
    inter_node: int              # bytes it received from ranks of the other node
    by_group_size: dict          # all-gather input bytes by the size of the group it ran in
    shard_numel: int             # elements of this rank's primary shard of all parameters
