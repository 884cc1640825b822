"""What a rank's engine holds, measured: every tensor storage once, sorted into parameters, gradients,
optimizer states or buffers, where it lives, and the process's page-locked memory.

:func:`tensor_inventory` walks what an engine (its module, its ZeRO optimizer and the torch optimizer
inside) actually holds, follows every tensor to its storage, counts each storage once and sorts it by
where it was found. Views (a parameter that is a slice of a flat buffer, a partition that is a slice of
a flat group) share their storage and are not counted twice. What the ZeRO paper says these bytes
should be is in :mod:`course_utils.common.zero_rules`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

CATEGORIES = ("params", "grads", "optimizer", "buffers")


@dataclass
class TensorEntry:
    path: str           # where it was found first, e.g. "optimizer.single_partition_of_fp32_groups[0]"
    category: str       # params | grads | optimizer | buffers
    dtype: str
    numel: int          # elements of the whole storage
    nbytes: int         # bytes of the whole storage
    device: str
    storage: int = 0    # the storage's address: which structure DeepSpeed placed it in can be told by identity


def _category(path: str) -> str:
    """Sort a tensor by the name it is held under (DeepSpeed's attribute names say what they are)."""
    p = path.lower()
    leaf = p.rsplit(".", 1)[-1]
    if leaf.startswith("grad") or "grad" in leaf:
        return "grads"
    if "bucket" in p or "buffer" in p:
        return "buffers"
    if ".state[" in p or "fp32" in p or "master" in p:
        return "optimizer"
    return "params"


# the stronger claim wins when one storage is reachable under several names
_PRIORITY = {"grads": 0, "optimizer": 1, "params": 2, "buffers": 3}


def _children(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}[{k!r}]" if not hasattr(k, "shape") else f"{path}[<param>]", v
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield f"{path}[{i}]", v
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("deepspeed", "torch"):
        for k, v in vars(obj).items():
            yield f"{path}.{k}", v


def _walk(obj: Any, path: str, seen: set[int], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every tensor reachable from ``obj`` (and the .grad / .ds_tensor hanging off tensors)."""
    import torch

    if depth > 12:
        return
    if isinstance(obj, torch.Tensor):         # a tensor may be held under several names: yield each

        yield path, obj
        for extra in ("grad", "ds_tensor"):
            sub = getattr(obj, extra, None)
            if isinstance(sub, torch.Tensor):
                yield from _walk(sub, f"{path}.{extra}", seen, depth + 1)
        return
    if id(obj) in seen or isinstance(obj, torch.nn.Module):    # modules: walked via named_parameters()
        return
    seen.add(id(obj))
    for child_path, child in _children(obj, path):
        yield from _walk(child, child_path, seen, depth + 1)


def tensor_inventory(engine: Any) -> list[TensorEntry]:
    """Each tensor storage the engine holds, once, with the category of the strongest name it is held under.

    Walks ``engine.module`` (parameters, their ``.grad``, stage 3's ``.ds_tensor``, module buffers)
    and ``engine.optimizer`` (the ZeRO/fp16 wrapper, and the torch optimizer with its ``state``).
    """
    import torch

    found: dict[int, TensorEntry] = {}

    def add(path: str, t: torch.Tensor, category: str | None = None) -> None:
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or t.device.type == "meta":
            return
        key = storage.data_ptr()
        cat = category or _category(path)
        old = found.get(key)
        if old is None or _PRIORITY[cat] < _PRIORITY[old.category]:
            found[key] = TensorEntry(path, cat, str(t.dtype).replace("torch.", ""),
                                     storage.nbytes() // t.element_size(), storage.nbytes(), str(t.device), key)

    seen: set[int] = set()
    module = engine.module
    for name, p in module.named_parameters():
        for path, t in _walk(p, f"module.{name}", seen):
            add(path, t, "grads" if path.endswith(".grad") else "params")
    for name, b in module.named_buffers():
        add(f"module.{name}", b, "buffers")
    for path, t in _walk(engine.optimizer, "optimizer", seen):
        add(path, t)
    return sorted(found.values(), key=lambda e: -e.nbytes)


def model_state_bytes(inventory: list[TensorEntry], device: str | None = None) -> dict[str, int]:
    """Bytes per category (params, grads, optimizer, buffers) and ``model_states`` (the first three),
    optionally only for tensors on ``device`` ("cpu", "cuda")."""
    out = {c: 0 for c in CATEGORIES}
    for e in inventory:
        if device is None or e.device.split(":")[0] == device:
            out[e.category] += e.nbytes
    out["model_states"] = out["params"] + out["grads"] + out["optimizer"]
    return out


# ---------------------------------------------------------------- the process's memory (Linux)

def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key} line: this measurement needs Linux.")


def locked_bytes() -> int:
    """Page-locked (``mlock``-ed) memory of this process now (VmLck): pinned host buffers that can never be
    swapped out, such as the staging buffers of DeepSpeed's NVMe swappers."""
    return _status_bytes("VmLck")
