"""LoRA adapters (``peft``) under ZeRO, inside a rank (notebook 12): the adapter the notebook trains, the data,
the model-state formula with frozen weights, what a state dict holds of an adapter ZeRO-3 partitioned (the records
``scripts/12_adapters.py`` writes are declared in :mod:`course_utils.common.records.adapters`).

The model is ``models.tiny_gpt2("checkpoints")`` (no dropout, so a step depends only on weights, optimizer
state and batch) with the learnable sequences of :func:`data.sample`. Nothing heavy is imported at the top:
the notebook uses :func:`expected_bytes` as it is.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from course_utils.common import run_folder
from course_utils.common.record import record
from course_utils.common.records.adapters import Saved, Zero3Load
from course_utils.rank.scaffolding import scratch_dir

PRESET = "checkpoints"          # tiny_gpt2 preset: GPT-2 classes, 64 wide, 2 blocks, no dropout
LORA_R = 8                      # the adapter the notebook works out: rank 8 ...
LORA_TARGETS = ("c_attn",)      # ... on the attention's query/key/value projection of every block
SEED = 0                        # LoRA's A matrices are random: the same draw on every rank and in every run


def lora_config(r: int = LORA_R, targets: tuple[str, ...] | list[str] = LORA_TARGETS):
    """peft's ``LoraConfig`` for GPT-2: its projections are ``Conv1D`` layers, whose weight is stored
    (in, out) instead of ``nn.Linear``'s (out, in): ``fan_in_fan_out=True`` says so."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets), lora_dropout=0.0,
                      fan_in_fan_out=True, task_type="CAUSAL_LM")


def with_lora(model, r: int = LORA_R, targets: tuple[str, ...] | list[str] = LORA_TARGETS):
    """``get_peft_model(model, lora_config(r, targets))``: the base weights frozen, A random (:data:`SEED`), B zero."""
    import torch
    from peft import get_peft_model

    torch.manual_seed(SEED)
    with warnings.catch_warnings():      # peft asks transformers a question transformers 5 renamed: noise
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, lora_config(r, targets))


def micro_batch(step: int, rank: int, world_size: int, micro: int):
    """This rank's samples of training step ``step``: a contiguous share of the step's global batch, as
    accelerate's data loader shards a sequential sampler (rank r takes the r-th batch of each group of
    ``world_size`` batches), so a raw loop and the Trainer see the same samples."""
    from course_utils.rank.data import global_batch, rank_slice

    return rank_slice(global_batch(step, micro * world_size), rank, world_size)


class SampleDataset:
    """:func:`data.sample` as a map-style data set for the Trainer (``input_ids`` and ``labels``)."""

    def __init__(self, rows: int):
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict:
        from course_utils.rank.data import sample

        ids = sample(i)
        return {"input_ids": ids, "labels": ids.clone()}


def trainable_numel(model) -> tuple[int, int]:
    """(trainable, all) parameters, each distinct parameter once; under ZeRO-3 ``ds_numel`` counts a
    partitioned parameter whole."""
    seen, trainable, total = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = getattr(p, "ds_numel", p.numel())
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def expected_bytes(total: int, trainable: int, stage: int, world_size: int, persistent: int = 0,
                   grad_partition: int | None = None) -> dict[str, float]:
    """Model-state bytes per rank for fp32 AdamW when only ``trainable`` of ``total`` parameters train.

    Gradients and optimizer states exist only for trainable parameters; the weights, frozen or not, are
    held whole until stage 3 partitions them. With DeepSpeed's choices measured in notebook 03: stages
    1-3 keep an fp32 master copy of their partition (12 bytes per trainable parameter / N with Adam's two
    moments), stage 2 holds the gradients of the whole parameters touching its partition
    (``grad_partition`` elements, default trainable / N), stage 3 keeps ``persistent`` small parameters
    whole on every rank next to their shard."""
    n = world_size
    params = 4 * total if stage < 3 else 4 * (total / n + persistent)
    if stage == 0:
        grads, optimizer = 4 * trainable, 8 * trainable
    else:
        grads = 4 * (grad_partition if stage in (1, 2) and grad_partition else trainable / n)
        optimizer = 12 * trainable / n
    return {"params": params, "grads": grads, "optimizer": optimizer, "model_states": params + grads + optimizer}


def adapter_view(state: dict, model) -> list[dict]:
    """What a state dict holds for each LoRA tensor, next to what ZeRO-3 knows about the parameter:
    shape held, full shape (``ds_shape``), whether it is kept whole on every rank (``ds_persist``)."""
    params = dict(model.named_parameters())
    rows = []
    for key, tensor in state.items():
        match = params.get(key.replace(".weight", ".default.weight"))     # peft's key leaves out the adapter name
        rows.append({"key": key, "shape": list(tensor.shape), "numel": tensor.numel(),
                     "full_shape": list(getattr(match, "ds_shape", tensor.shape)),
                     "persistent": bool(getattr(match, "ds_persist", False))})
    return rows


def saved_activation_bytes(model, ids) -> int:
    """Bytes autograd keeps for backward during one forward pass of ``model`` on ``ids`` (each storage once,
    the parameters themselves left out): the activations a training step holds at its forward's end."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(kept.values())


# ---------------------------------------------------------------- files every rank reads, and what ZeRO-3 holds

def shared_folder(name: str) -> Path:
    """A folder every rank can read: inside the launch's run folder, where it stays for the notebook to read
    (outside the course's runner: a temporary folder, removed when the rank exits)."""
    return (run_folder.current() or Path(scratch_dir("course12-"))) / name


PRETRAIN_STEPS = 60              # the base model's own training before any adapter: loss from about 4.2 to about 2
PRETRAIN_SAMPLES = 1_000_000     # its samples start here: none of the adapter runs' samples (0 …) nor fixed_batch's


def pretrained(model, steps: int = PRETRAIN_STEPS, batch: int = 8, lr: float = 3e-3):
    """``model`` after ``steps`` steps of plain full training (AdamW, on one process) on the course's sequences: a
    base model that already predicts them, as a real pretrained checkpoint does, so that what an adapter adds shows
    in the loss (a random base sits at ln(vocabulary) whatever a small adapter does)."""
    import torch

    from course_utils.rank.data import sample

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for step in range(steps):
        ids = torch.stack([sample(PRETRAIN_SAMPLES + step * batch + i) for i in range(batch)])
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return model


def save_base() -> str:
    """Rank 0 trains the course's tiny GPT-2 a little (:func:`pretrained`) and writes it as a pretrained checkpoint
    (save_pretrained); every rank waits."""
    import torch.distributed as dist
    from transformers.utils import logging

    from course_utils.rank.models import tiny_gpt2

    logging.disable_progress_bar()                    # no "Writing model shards" bars in the rank logs
    folder = shared_folder("base")
    if dist.get_rank() == 0:
        pretrained(tiny_gpt2(PRESET)).save_pretrained(folder)
    dist.barrier()
    return str(folder)


def zero3_view(model, phase: str) -> None:
    """Record what this rank holds of ``model`` now (a :class:`Zero3Load`)."""
    import torch.distributed as dist

    params = list(model.parameters())
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    whole = lambda p: getattr(p, "ds_numel", p.numel())      # noqa: E731
    record(Zero3Load(rank=dist.get_rank(), phase=phase, full_numel=sum(whole(p) for p in params),
                     held_numel=sum(p.data.numel() for p in params),
                     shard_numel=sum(p.ds_tensor.numel() for p in params if hasattr(p, "ds_tensor")),
                     partitioned=sum(hasattr(p, "ds_id") for p in params), parameters=len(params),
                     lora_held=sum(p.data.numel() for p in lora), lora_numel=sum(whole(p) for p in lora)))


def save_adapter(label: str, model, state: dict | None) -> None:
    """Rank 0 writes the adapter with peft's ``save_pretrained`` (from its own state dict when ``state`` is None)
    into ``adapters/<label>``; every rank waits."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        folder = shared_folder(f"adapters/{label}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.save_pretrained(folder, state_dict=state)
        record(Saved(label=label, folder=str(folder),
                     warnings=[str(w.message) for w in caught if "LoRA tensor" in str(w.message)]))
    dist.barrier()
