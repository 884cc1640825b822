"""Notebook 16, section 3's long sequence: a model whose model states fit under ZeRO-3 + CPU offload, trained on one
sequence short and long under the same limit, with and without activation checkpointing
(``scripts/16_long_sequence.py``), named once for the rank and the notebook.

One engine, three passes in this order: the short sequence without checkpointing (the model fits), the long one with
transformers' ``activation_checkpointing_enable()`` (it fits), the long one without it, with DeepSpeed's
``activation_checkpointing`` config section only (the limit ends the rank). The fitting pass comes first because the
other one ends the process: on a CPU the out-of-memory killer's SIGKILL leaves nothing to run after it.
"""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record

CONFIGURATION = "ZeRO-3 + offload (CPU)"     # one of notebook 16's configurations (records.bigger.CONFIGURATIONS)
# A narrow, deep GPT-2: activations grow with n_embd × n_layer per token, model states and FLOPs with n_embd² × n_layer,
# so a narrow model holds much activation memory for little compute and small model states (3.5 M parameters at 2,048
# positions: 53 MiB of fp32 Adam model states).
N_EMBD, N_LAYER = 128, 16
# DeepSpeed's section as its documentation shows it: what people add to a config to "turn checkpointing on"
DS_SECTION = {"partition_activations": True, "cpu_checkpointing": True, "contiguous_memory_optimization": False,
              "synchronize_checkpoint_boundary": False}
SHORT, CHECKPOINTED, PLAIN = "short", "long, checkpointed", "long, not checkpointed"


def passes(short: int, long: int) -> list[tuple[str, int, bool]]:
    """(name, tokens, transformers' activation checkpointing on) of the three passes, in the order the rank runs
    them."""
    return [(SHORT, short, False), (CHECKPOINTED, long, True), (PLAIN, long, False)]


@dataclass
class Pass(Record, name="bigger_sequence_pass"):
    """A pass the rank is about to run (recorded first: the limit may end the rank during it)."""
    name: str
    tokens: int
    params: int                   # the model's parameters (the same in every pass)
    checkpointed_blocks: int      # GPT-2 blocks whose ``gradient_checkpointing`` flag is set
    blocks: int
    ds_configured: bool           # deepspeed.checkpointing.is_configured(): did anything configure DeepSpeed's own?
    config_section: bool          # the engine's config holds DeepSpeed's activation_checkpointing section
    held_before: int              # bytes the limit counted right before the pass


@dataclass
class BlockMemory(Record, name="bigger_sequence_block"):
    """What the limit counted right after a GPT-2 block's forward (a forward hook on the block): the activations the
    pass keeps pile up block by block. On a GPU, the bytes tensors hold (``memory_allocated``), which the capped
    allocator's reserve only rounds up."""
    name: str
    block: int
    bytes: int


@dataclass
class PassResult(Record, name="bigger_sequence_result"):
    """A pass that trained: a forward, a backward and an optimizer step on one sequence."""
    name: str
    tokens: int
    loss: float
    seconds: float
    peak_bytes: int               # the most the limit counted during the pass (cgroup peak, or CUDA reserved peak)
