"""Notebook 17 ("long context"): the model's shape, the data's, and the records of ``scripts/17_long_context.py``,
named once for the ranks and the notebook."""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import Record

# A tiny Llama (LlamaConfig): 4 query heads, 2 key/value heads (grouped-query attention, as Llama 3 has 32 and 8),
# so SP sizes 2 and 4 are allowed and 4 replicates the key/value heads
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 2048, 64, 256, 2, 4, 2
POSITIONS = 1 << 16
PERIOD = 64          # the data: a random block of PERIOD tokens, repeated
LR = 3e-3          # AdamW: the loss falls from ln(VOCAB) ≈ 7.6 by about 0.5 in 8 steps of 1024 tokens
CLIP = 1.0           # gradient_clipping, as configs/17_long_context.json says (DeepSpeed's default is 1.0 too)
PROMPT = PERIOD      # the first block cannot be predicted: it is the "prompt", its labels are -100


@dataclass
class Reference(Record, name="lc_reference"):
    """The same model trained in one process without DeepSpeed or sequence parallelism (rank 0)."""
    seq_len: int
    losses: list             # per step: the mean loss over the tokens with a label
    grad_norms: list         # per step: the gradient's L2 norm before the optimizer step


@dataclass
class HeadRule(Record, name="lc_head_rule"):
    """``UlyssesSPAttentionHF`` built for a head layout over this launch's SP group: accepted, or DeepSpeed's error."""
    heads: int
    kv_heads: int
    sp_size: int
    error: str | None        # DeepSpeed's ValueError, None when accepted
    local_q_heads: int | None = None
    local_kv_heads: int | None = None


@dataclass
class SpRun(Record, name="lc_sp_run"):
    """One rank of a sequence-parallel training run: what it held and what the run measured."""
    label: str               # "adapter" (DeepSpeed's sharding), "tutorial" (the loop that shifts after sharding), "yours"
    rank: int
    sp_size: int
    seq_len: int
    local_tokens: list       # per step: tokens this rank's shard held
    labelled: list           # per step: this rank's tokens with a label (shift_labels != -100)
    losses: list             # per step: the mean token loss over the whole sequence (sum and count over the SP group)
    grad_norms: list         # per step: the engine's global gradient norm
    alltoall: dict = field(default_factory=dict)     # message bytes → count, all_to_all_single, one whole step
    shards: list = field(default_factory=list)       # DeepSpeed's adapter: the first step's shard, {key: list of ints}
    edges: dict = field(default_factory=dict)        # the first step: the piece's last two labels, its first two tokens


@dataclass
class Shape(Record, name="lc_shape"):
    """The attention shapes the all-to-all formula needs, read from the model's config on rank 0."""
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
