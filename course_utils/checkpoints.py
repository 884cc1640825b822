"""Checkpoints of DeepSpeed engines: a tiny model and data to make them, and tools to read and compare them.

Notebook 09 proves every claim about checkpoints by comparing numbers, so this module supplies what
those comparisons need: a deterministic model and data stream (a resumed run must see exactly the
batches an uninterrupted run sees), the files of a checkpoint with what each one holds, and
the largest difference between two state dicts or two loss curves.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping

import torch

from . import models

VOCAB = 64
SEQ_LEN = 16


def tiny_gpt2(seed: int = 0):
    """A 2-layer GPT-2 (about 0.1 M parameters) built from a config, without dropout.

    No dropout means a training step depends only on the weights, the optimizer state and the batch:
    exactly what a DeepSpeed checkpoint holds. (With dropout, also save the RNG state in ``client_state``.)
    """
    return models.tiny_gpt2(VOCAB, SEQ_LEN, n_embd=64, n_layer=2, n_head=2, seed=seed, dropout=0.0,
                            special_token_id=0)


def sample(index: int) -> torch.Tensor:
    """Sequence ``index`` of the data: an arithmetic progression modulo the vocabulary (learnable)."""
    g = torch.Generator().manual_seed(index)
    start, stride = torch.randint(0, VOCAB, (2,), generator=g).tolist()
    return (start + (stride % 7 + 1) * torch.arange(SEQ_LEN)) % VOCAB


def global_batch(step: int, batch_size: int) -> torch.Tensor:
    """The samples of training step ``step`` (0-based): the same for any number of ranks."""
    return torch.stack([sample(step * batch_size + i) for i in range(batch_size)])


def rank_slice(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's micro-batch of a global batch (contiguous shards, so 2 ranks × 4 == 1 rank × 8)."""
    if len(batch) % world_size:
        raise ValueError(f"A global batch of {len(batch)} does not split over {world_size} ranks: "
                         f"choose a batch size that is a multiple of the number of ranks.")
    per_rank = len(batch) // world_size
    return batch[rank * per_rank:(rank + 1) * per_rank]


def fixed_batch() -> torch.Tensor:
    """The batch on which exported models are compared (never used for training)."""
    return torch.stack([sample(10_000_000 + i) for i in range(4)])


# What each file of a DeepSpeed checkpoint holds, matched by name.
_ROLES = [
    (r"^latest$", "text file with the tag of the newest checkpoint; load_checkpoint(dir) reads it"),
    (r"^latest_universal$", "tag of the universal checkpoint (read when load_universal is on)"),
    (r"^zero_to_fp32\.py$", "a copy of DeepSpeed's converter: turns the partitions into one fp32 state dict"),
    (r"^mp_rank_\d+_model_states\.pt$",
     "module weights (full, written by rank 0), client_state, lr scheduler, step counters, config"),
    (r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$",
     "ZeRO-3: rank {0}'s slice bookkeeping, client_state, scheduler, counters (weights are in the optim file)"),
    (r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$",
     "rank {1}'s partition: its fp32 master weights and Adam moments"),
]


def file_role(name: str) -> str:
    """What a checkpoint file with this name holds."""
    for pattern, role in _ROLES:
        m = re.match(pattern, name)
        if m:
            return role.format(*[g or "" for g in m.groups()])
    return "(not a DeepSpeed checkpoint file)"


def checkpoint_files(checkpoint_dir: Path | str) -> list[dict]:
    """Every file under a checkpoint folder: path relative to it, size, and what it holds."""
    root = Path(checkpoint_dir)
    return [{"file": str(p.relative_to(root)), "bytes": p.stat().st_size, "holds": file_role(p.name)}
            for p in sorted(root.rglob("*")) if p.is_file()]


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts over their common keys.

    Raises when a key of one is missing in the other (a silent partial comparison proves nothing).
    Tensors that share storage under two names (tied weights) are compared under each name.
    """
    missing = set(a) ^ set(b)
    if missing:
        raise KeyError(f"The state dicts hold different tensors: {sorted(missing)[:5]}")
    return max(float((a[k].detach().float() - b[k].detach().float()).abs().max()) for k in a)


def max_abs_series_diff(a: Iterable[float], b: Iterable[float]) -> float:
    """Largest absolute difference between two equal-length series (two loss curves)."""
    a, b = list(a), list(b)
    if len(a) != len(b) or not a:
        raise ValueError(f"Series of different or zero length: {len(a)} vs {len(b)}")
    return max(abs(x - y) for x, y in zip(a, b))


def try_weights_only(path: Path | str) -> str:
    """``torch.load(path, weights_only=True)``: "ok", or the first line of why it refused the file."""
    try:
        torch.load(path, map_location="cpu", weights_only=True)
        return "ok"
    except Exception as e:  # the unpickler's refusal names the global it would not load
        text = str(e)
        m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        return f"refused: needs {m.group(1)}" if m else f"refused: {text.splitlines()[0][:100]}"


def find_script(name: str) -> Path:
    """A converter script shipped inside the installed DeepSpeed (e.g. ``checkpoint/ds_to_universal.py``)."""
    import deepspeed

    path = Path(deepspeed.__file__).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not part of DeepSpeed {deepspeed.__version__} at {path.parent}")
    return path
