"""The two comparisons the notebooks prove their claims with: two series of numbers (loss curves,
learning-rate curves) and two state dicts (model weights)."""
from __future__ import annotations

from typing import Iterable, Mapping


def max_abs_series_diff(a: Iterable[float], b: Iterable[float]) -> float:
    """Largest absolute difference between two equally long, non-empty series (two loss curves)."""
    a, b = list(a), list(b)
    if len(a) != len(b) or not a:
        raise ValueError(f"Series of different or zero length ({len(a)} vs {len(b)}): compare the same steps")
    return max(abs(x - y) for x, y in zip(a, b))


def max_abs_state_diff(a: Mapping, b: Mapping) -> float:
    """Largest absolute difference between two state dicts (name → tensor) over all their tensors.

    Raises when a key of one is missing in the other (a silent partial comparison proves nothing).
    Tensors that share storage under two names (tied weights) are compared under each name.
    """
    missing = set(a) ^ set(b)
    if missing:
        raise KeyError(f"The state dicts hold different tensors: {sorted(missing)[:5]}")
    return max(float((a[k].detach().float() - b[k].detach().float()).abs().max()) for k in a)
