"""DeepSpeed checkpoints as notebook 09 inspects them: what each file holds, whether
``torch.load(weights_only=True)`` accepts it, and the converter scripts DeepSpeed ships.

The model and data the checkpoints are made from are rank-side (``models.tiny_gpt2("checkpoints")``,
:mod:`course_utils.rank.data`); the comparisons are in :mod:`course_utils.compare`.
"""
from __future__ import annotations

import re
from pathlib import Path

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


def try_weights_only(path: Path | str) -> str:
    """``torch.load(path, weights_only=True)``: "ok", or the first line of why it refused the file."""
    import torch

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
