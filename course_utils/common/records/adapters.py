"""Notebook 12's records: LoRA adapters under ZeRO (``scripts/12_adapters.py``, built in
:mod:`course_utils.rank.adapters`)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class AdapterMemory(Record, name="adapter_memory"):
    """One rank's model states after a backward (gradients held, Adam's states present), full or LoRA."""
    stage: int
    kind: str                     # "full", "lora", or "exercise" (exercise 1's adapter)
    r: int
    targets: list
    rank: int
    world_size: int
    total: int                    # parameters, each once (ds_numel under stage 3)
    trainable: int
    peft_trainable: int           # peft's own count (get_nb_trainable_parameters)
    measured: dict                # model_state_bytes: params, grads, optimizer, buffers, model_states
    persistent_numel: int         # stage 3: elements of the parameters kept whole on every rank
    grad_partition_numel: int     # stage 2: elements of the whole trainable parameters touching this rank's partition
    messages: dict                # rank's collectives of one step (comms logger): op → {message bytes: count}


@dataclass
class Activations(Record, name="activations"):
    """What autograd keeps for backward in one forward of the plain model (no DeepSpeed), full or LoRA."""
    kind: str
    trainable: int
    micro_batch: int
    tokens: int
    saved_bytes: int


@dataclass
class Losses(Record, name="losses"):
    label: str
    losses: list                  # mean over the ranks of each step's loss


@dataclass
class TokenCount(Record, name="token_count"):
    """How the Trainer counted the tokens it divides the summed loss by: over labels[..., 1:] or all labels."""
    label: str
    loss_type: str
    shifts_labels: bool


@dataclass
class AdapterState(Record, name="adapter_state"):
    """What ``get_peft_model_state_dict`` holds for each LoRA tensor on one rank, outside any gather."""
    rank: int
    tensors: list                 # adapter_view rows


@dataclass
class Zero3Load(Record, name="adapter_zero3_load"):
    """What one rank holds of the model at a point of loading it under ZeRO-3 (elements)."""
    rank: int
    phase: str
    full_numel: int               # every parameter, whole
    held_numel: int               # what the parameters' .data hold on this rank
    shard_numel: int              # this rank's partitions (ds_tensor)
    partitioned: int              # parameters ZeRO-3 manages (they carry a ds_id)
    parameters: int
    lora_held: int                # elements the LoRA parameters' .data hold
    lora_numel: int


@dataclass
class Saved(Record, name="adapter_saved"):
    """An adapter folder rank 0 wrote, and what peft warned while writing it."""
    label: str
    folder: str
    warnings: list


@dataclass
class OneDevice(Record, name="one_device"):
    """One LoRA fine-tune through the Trainer on one rank (``--one_device``): what a one-GPU user runs."""
    config: str                   # the config file's name
    stage: int
    offload: list                 # what the config offloads to the host: "optimizer", "param"
    device: str                   # where the rank computes: "cuda" or "cpu"
    dtype: str                    # the engine's compute dtype
    model: str                    # the GPT-2's shape: the lesson's own, or the GPU size of the launch
    total: int
    trainable: int
    optimizer: str                # the engine's optimizer class (DeepSpeedCPUAdam when it steps on the host)
    step_seconds: list            # wall time of each optimizer step after the first
    device_peak_reserved: int     # torch.cuda.max_memory_reserved on a GPU rank; 0 on a CPU rank
    host_peak_rss: int            # the rank's peak resident memory (VmHWM)
    losses: list
