"""Where the bytes of a ZeRO engine live, and what the ZeRO paper says they should be.

Two halves that the notebooks hold side by side:

* **measured** — :func:`tensor_inventory` walks what an engine (its module, its ZeRO optimizer and
  the torch optimizer inside) actually holds, follows every tensor to its storage, counts each
  storage once and sorts it into parameters, gradients, optimizer states or buffers by where it was
  found. Views (a parameter that is a slice of a flat buffer, a partition that is a slice of a flat
  group) share their storage and are not counted twice.
* **theory** — :func:`zero_formula` is the paper's model-state memory per rank (Rajbhandari et al.,
  "ZeRO", 2020): with mixed-precision Adam a model of Ψ parameters needs 2Ψ (16-bit parameters) +
  2Ψ (16-bit gradients) + 12Ψ (fp32 master weights, momentum, variance) bytes, and stages 1, 2, 3
  divide the last one, the last two, all three by the number of ranks N.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

CATEGORIES = ("params", "grads", "optimizer", "buffers")
GB = 1e9        # the paper's GB (10⁹ bytes)
GiB = 2 ** 30

# ---------------------------------------------------------------- theory

# bytes per parameter of each model state, before partitioning
BYTES_PER_PARAM = {
    # 16-bit params + 16-bit grads + (fp32 master + fp32 momentum + fp32 variance) = 2 + 2 + 12
    "bf16": {"params": 2, "grads": 2, "optimizer": 12},
    "fp16": {"params": 2, "grads": 2, "optimizer": 12},
    # fp32 training: params and grads are already fp32, Adam keeps momentum + variance = 4 + 4 + 8
    "fp32": {"params": 4, "grads": 4, "optimizer": 8},
}
# which states a stage partitions across the data-parallel ranks
PARTITIONED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}


def _check_stage_dtype(stage: int, dtype: str) -> None:
    if stage not in PARTITIONED:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage!r}.")
    if dtype not in BYTES_PER_PARAM:
        raise ValueError(f"dtype must be one of {sorted(BYTES_PER_PARAM)}, not {dtype!r}.")


def zero_formula(num_params: float, stage: int, world_size: int, dtype: str = "bf16") -> dict[str, float]:
    """Model-state bytes per rank by the ZeRO paper: {"params", "grads", "optimizer", "total"}.

    ``dtype="bf16"`` (or ``"fp16"``) is mixed-precision Adam: 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N for
    stages 0–3. ``dtype="fp32"`` is plain fp32 Adam: 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N.
    """
    _check_stage_dtype(stage, dtype)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}.")
    out = {k: num_params * b / (world_size if k in PARTITIONED[stage] else 1)
           for k, b in BYTES_PER_PARAM[dtype].items()}
    out["total"] = sum(out.values())
    return out


def paper_example(num_params: float = 7.5e9, world_size: int = 64) -> dict[str, float]:
    """The paper's Figure 1 example in GB per rank for stages 0–3 (7.5 B parameters, 64 ranks:
    120, 31.4, 16.6 and 1.9 GB)."""
    return {str(s): zero_formula(num_params, s, world_size, "bf16")["total"] / GB for s in range(4)}


def deepspeed_expected(num_params: int, stage: int, world_size: int, dtype: str,
                       grad_partition_numel: int | None = None, persistent_numel: int = 0) -> dict[str, float]:
    """The paper's formula adjusted for what DeepSpeed 0.19 does on purpose (read in its code):

    - **fp32 master copy in fp32 too** (stages 1–3): ``single_partition_of_fp32_groups`` (stage 1/2)
      and ``fp32_partitioned_groups_flat`` (stage 3) are ``.clone().float()`` of the partition even when
      the model is already fp32, so the optimizer side holds 4Ψ/N more than momentum + variance.
    - **stage 1 partitions gradients too** (at an accumulation boundary): with
      ``gradient_accumulation_steps = 1`` every backward ends on a boundary, and stage_1_and_2.py
      then reduces each bucket into ``grads_in_partition`` exactly as stage 2 does.
    - **boundary parameters** (stages 1/2): ``grads_in_partition`` is sized by the *whole* parameters
      that touch this rank's partition (``params_in_partition``), so a rank holds the full gradient
      of a parameter that straddles its partition's edge: pass ``grad_partition_numel`` to use it.
    - **persistent parameters** (stage 3): parameters with at most
      ``stage3_param_persistence_threshold`` elements stay whole on every rank next to their shard.
    """
    out = zero_formula(num_params, stage, world_size, dtype)
    per = BYTES_PER_PARAM[dtype]
    if dtype == "fp32" and stage >= 1:
        out["optimizer"] += 4 * num_params / world_size
    if stage in (1, 2):
        out["grads"] = per["grads"] * (grad_partition_numel or num_params / world_size)
    if stage == 3:
        out["params"] += per["params"] * persistent_numel
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


# ---------------------------------------------------------------- measurement

@dataclass
class TensorEntry:
    path: str           # where it was found first, e.g. "optimizer.single_partition_of_fp32_groups[0]"
    category: str       # params | grads | optimizer | buffers
    dtype: str
    numel: int          # elements of the whole storage
    nbytes: int         # bytes of the whole storage
    device: str


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
                                     storage.nbytes() // t.element_size(), storage.nbytes(), str(t.device))

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
