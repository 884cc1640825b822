"""DeepSpeed checkpoints as notebook 09 inspects them: what each file holds, the folder drawn as a tree
with its sizes, whether ``torch.load(weights_only=True)`` accepts a file, the converter scripts DeepSpeed
ships, and the lines of the installed libraries that decide what gets written.

The model and data the checkpoints are made from are rank-side (``models.tiny_gpt2("checkpoints")``,
:mod:`course_utils.rank.data`); the comparisons are in :mod:`course_utils.kernel.compare`.
"""
from __future__ import annotations

import io
import re
from contextlib import contextmanager, redirect_stdout
from typing import Iterator
from pathlib import Path

from course_utils.kernel.views.source import show_source  # noqa: F401  (notebook 09 calls ck.show_source)

# What each file of a DeepSpeed checkpoint holds, matched by name.
_ROLES = [
    (r"^latest$", "text file with the tag of the newest checkpoint; load_checkpoint(dir) reads it"),
    (r"^latest_universal$", "tag of the universal checkpoint (read when load_universal is on)"),
    (r"^zero_to_fp32\.py$", "a copy of DeepSpeed's converter: turns the partitions into one fp32 state dict"),
    (r"^zero_to_torch\.py$", "a copy of DeepSpeed's converter to PyTorch weights in a chosen dtype (--dtype fp32/fp16/bf16)"),
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


def tag_files(tag_dir: Path | str) -> list[str]:
    """The names of the files in one checkpoint tag folder (``global_step<N>``), as the ranks wrote them."""
    return sorted(p.name for p in Path(tag_dir).iterdir() if p.is_file())


def human_bytes(n: int) -> str:
    """``1536`` → ``"1.5 KiB"`` (binary units, as the rest of the course uses)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree(folder: Path | str, title: str | None = None) -> str:
    """``folder`` drawn as a tree (like the ``tree`` command), every file and folder with its size, read
    from the disk now: ``title`` (default: the folder's name) and the total on the first line."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"No folder {root}: run the launch that writes it first")
    rows: list[tuple[str, int]] = []

    def walk(path: Path, prefix: str) -> None:
        children = sorted(path.iterdir(), key=lambda p: p.name)
        for i, child in enumerate(children):
            last = i == len(children) - 1
            label = child.name + ("/" if child.is_dir() else "")
            size = _folder_bytes(child) if child.is_dir() else child.stat().st_size
            rows.append((prefix + ("└── " if last else "├── ") + label, size))
            if child.is_dir():
                walk(child, prefix + ("    " if last else "│   "))

    walk(root, "")
    width = max([len(r) for r, _ in rows] + [0])
    head = f"{title or root.name}/  ({human_bytes(_folder_bytes(root))})"
    return "\n".join([head] + [f"{r.ljust(width)}  {human_bytes(b):>10}" for r, b in rows])


def side_by_side(*blocks: str, gap: int = 4) -> str:
    """Text blocks (e.g. two :func:`tree` drawings) printed next to each other."""
    split = [b.splitlines() for b in blocks]
    widths = [max(len(line) for line in lines) for lines in split]
    height = max(len(lines) for lines in split)
    rows = []
    for i in range(height):
        cells = [(lines[i] if i < len(lines) else "").ljust(w) for lines, w in zip(split, widths)]
        rows.append((" " * gap).join(cells).rstrip())
    return "\n".join(rows)


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


@contextmanager
def converter_output() -> Iterator[io.StringIO]:
    """Collect what DeepSpeed's ``zero_to_fp32`` functions print ("Processing zero checkpoint …", four lines a call)
    instead of streaming it: ``with converter_output() as said: …``, then ``said.getvalue()`` where it teaches."""
    said = io.StringIO()
    with redirect_stdout(said):
        yield said
