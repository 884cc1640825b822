"""Notebook 17's memory launches (``scripts/17_longest_sequence.py``): the lengths tried, the records of each, and the
engine's keys, named once for the ranks and the notebook.

One launch per sequence-parallel (SP) size, the world size of the launch: every rank under a limit of its own (a count
of its tensors' bytes, ``course_utils.rank.tensor_bytes``, like one device each) trains the course's tiny Llama on
sequences of growing length until the limit stops it. Before each length every rank records a
:class:`LengthAttempt`; after it trained, a :class:`LengthTrial` (its own limit's peak). A length attempted without a
trial is the one the limit stopped: its ranks record a :class:`LengthRefused`. A launch may first compare ALST's tiled MLP and tiled logits+loss with the plain
ones (:class:`TilingComparison`).
"""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record

# Sequence lengths, all multiples of 4·64 (SP 4 cuts each into 4 pieces of whole data periods), and each rank's limit
# (MiB of tensors it may hold from before its engine is built). With torch's math attention kernel (each head's L × L
# scores kept: memory grows with the square of the length) the limit stops SP 1 after 1024 tokens (peak 84 MiB; 1536
# would reach 168), SP 2 after 1536 (87; 2048: 145) and SP 4 after 2560 (114; 3072: 160). The peaks are counts, the
# same in every run; the limit stays 15 MiB or more from each, so that a later library version that moves them a
# little leaves the outcome, and a prediction of it, as they are.
LENGTHS = (512, 768, 1024, 1536, 2048, 2560, 3072)
CAP_MB = 130
KERNEL = "math"
KERNELS = ("default", "math")      # attention kernels: the one torch picks (a flash kernel here), or its math kernel
STEPS = 1             # optimizer steps per length: one is enough for a peak; the first length's step also makes the
#                       optimizer states (after its backward pass), which every later length holds before it starts

CONFIG = "17_long_context.json"    # the engine config of notebook 17 (ZeRO-3, AdamW), with the keys below
# Small buckets for a model of 0.4 M parameters: ZeRO-3 allocates its gradient bucket whole at start
# (``DeepSpeedZeroOptimizer_Stage3.__init__``: ``torch.empty(reduce_bucket_size)``), 2 GB at DeepSpeed's default of
# 5e8 elements, which the rank's count of its tensors (like a GPU's allocator) would hold whole. ``reduce_scatter``
# stays DeepSpeed's default, said here because the ranks' loss depends on it: this path averages the SP ranks'
# gradients (``course_utils.rank.sequence_memory.shard_loss``).
ZERO_KEYS = {"reduce_bucket_size": 1e6, "stage3_prefetch_bucket_size": 1e6, "stage3_max_live_parameters": 1e6,
             "stage3_max_reuse_distance": 1e6, "sub_group_size": 1e6, "reduce_scatter": True}


@dataclass
class LengthAttempt(Record, name="long_context_attempt"):
    """A length a rank is about to train (recorded first: the limit may end the rank while it tries)."""
    sp: int
    length: int


@dataclass
class LengthRefused(Record, name="long_context_refused"):
    """The length a rank's limit refused: the operator whose allocation took the rank's count of tensor bytes past the
    limit, and the count it reached (recorded by the rank before it ends)."""
    sp: int
    length: int
    operator: str
    count_bytes: int
    limit_bytes: int


@dataclass
class LengthTrial(Record, name="long_context_length"):
    """A length that trained under the limit, measured on one rank."""
    sp: int
    length: int                   # tokens of the whole sequence
    tokens_per_rank: int          # tokens this rank's shard held (length / SP)
    peak_bytes: int               # the most this rank's limit counted while the length trained
    held_before: int              # charged to the limit when the length started (the engine, what earlier lengths left)
    step_seconds: list            # wall seconds of each optimizer step (forward, backward, step)
    losses: list                  # the mean token loss over the whole sequence, per step
    attention: dict               # the first attention call's query/key/value shapes on this rank, and element size
    kernel: str = "default"       # the attention kernel: "default" (torch's choice) or "math"
    limit_bytes: int = 0


@dataclass
class TilingComparison(Record, name="long_context_tiling"):
    """One forward and backward pass of the engine at ``length`` with and without ALST's tiling (no optimizer step),
    measured by the rank's limit (the count of its tensors' bytes): per setting, the pass's rise over what the rank
    held before it, the loss, and the largest gradient difference from the plain pass."""
    length: int
    shards: int                   # slices of this rank's shard each tiling computes at a time (TiledMLP's rule)
    peaks: dict                   # setting → bytes the limit counted at the pass's peak beyond its start
    losses: dict                  # setting → loss
    grad_max_diff: dict           # setting → max |grad − plain grad| over every parameter
    loss_diff: dict               # setting → |loss − plain loss|
    seconds: dict                 # setting → wall seconds of the pass
