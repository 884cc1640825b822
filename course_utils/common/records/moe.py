"""Notebook 15's records: DeepSpeed's MoE layer (routing, expert-parallel layouts, ZeRO, checkpoints) and a
transformers MoE model under ZeRO-3, written by ``scripts/15_moe.py`` and ``scripts/15_moe_zero3.py``."""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import Record


@dataclass
class Routing(Record, name="moe_routing"):
    """One forward of an MoE layer on rank 0 alone: what its gate decided and what came out."""
    k: int
    capacity_factor: float
    tokens: int
    experts: int
    min_capacity: int
    capacity: int                # the gate's capacity C per expert, as the layer used it
    counts: list                 # tokens (routes) each expert was chosen for: the layer's third output
    dropped_tokens: int          # tokens whose output row is all zeros: no expert computed them
    l_aux: float


@dataclass
class Balance(Record, name="moe_balance"):
    """Expert counts of each training step (summed over the ranks) with an auxiliary-loss coefficient."""
    aux_coef: float
    counts: list                 # per step: tokens per expert, all ranks
    l_aux: list                  # per step: the gate's auxiliary loss on rank 0
    losses: list


@dataclass
class Layout(Record, name="moe_layout"):
    """One rank of a model with an MoE layer of ``experts`` experts, ``ep_size`` ranks per expert-parallel group."""
    label: str
    world_size: int
    rank: int
    experts: int
    ep_size: int
    k: int
    capacity_factor: float
    ffn: int
    hidden: int
    tokens: int                  # tokens per rank and step
    local_experts: list          # the global ids of the experts this rank holds
    expert_numel: int            # parameters of those experts on this rank
    dense_numel: int             # the other parameters (every rank holds them all)
    one_expert_numel: int        # parameters of one expert, counted on a fresh copy of the expert module
    ep_group: list               # ranks of this rank's expert-parallel group
    expert_dp_group: list        # ranks of this rank's expert-data-parallel group
    alltoall: dict               # message bytes → count, all_to_all_single, one forward and backward
    capacity: int
    alltoall_forward: dict = field(default_factory=dict)   # the same, the forward of that step only
    losses: list = field(default_factory=list)
    optimizer_groups: list = field(default_factory=list)   # as StageState's (the layouts train at ZeRO-1)


@dataclass
class StageState(Record, name="moe_zero_state"):
    """What one rank holds of a model with experts (ep_size 2) at a ZeRO stage."""
    stage: int
    rank: int
    expert_numel: int
    dense_numel: int
    measured: dict               # bytes per category: params, grads, optimizer, model_states
    optimizer_groups: list       # per param group of the torch optimizer: its name, moe flag, lr and elements
    label: str = "course"        # "yours": the engine your moe_zero2 built
    losses: list = field(default_factory=list)
    given_groups: list = field(default_factory=list)       # yours: the groups of your optimizer as you built it
    batch: dict = field(default_factory=dict)   # yours: the engine's micro-batch per rank, accumulation steps, clipping


@dataclass
class CheckpointFile(Record, name="moe_checkpoint_file"):
    """A file one rank wrote with ``save_checkpoint``."""
    rank: int
    file: str
    bytes: int


@dataclass
class Zero3Run(Record, name="moe_zero3_run"):
    """A transformers MoE model trained at ZeRO-3 on every rank: how it ended and what it gathered."""
    label: str
    family: str
    block: str                   # the sparse block's class
    leaf_section: dict | None    # zero_optimization.leaf_module as the config gave it (None: DeepSpeed's defaults)
    leaf_modules: int            # modules DeepSpeed marked as leaves
    blocks: int                  # the model's sparse blocks (modules of the block's class)
    outcome: str                 # "trained" or the error DeepSpeed raised
    losses: list = field(default_factory=list)
    fetches: int = 0             # parameter fetches (fetch_sub_module calls) of one training step on this rank
    step_ms: float = 0.0
