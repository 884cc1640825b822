"""Notebook 06's demonstrations, tables and figure: what this machine supports, the fp16 overflow
pitfall, and the loss-scale traces the ranks recorded."""
from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch

from .. import scripts
from ..rank.engine import dtype_name
from ..rank.data import random_batch
from ..rank.models import tiny_mlp
from ..rank.record import read_as

FP16_MAX = torch.finfo(torch.float16).max       # 65504: anything larger becomes inf in fp16
BF16_MAX = torch.finfo(torch.bfloat16).max      # ~3.4e38: the same exponent range as fp32


def read_traces(records: list[dict]) -> dict[str, Any]:
    """Rank 0's loss-scaling runs, label → ``Trace`` (declared in scripts/06_mixed_precision.py)."""
    return {t.label: t for t in read_as(records, scripts.load("06_mixed_precision").Trace)}


def overflow_table(scale: float = 1000.0, seed: int = 0) -> list[dict[str, Any]]:
    """The NaN pitfall: one forward pass of the same weights in fp32, bf16 and fp16.

    The first layer's weights are multiplied by ``scale`` so that the logits reach ~1e5, as happens
    in models pre-trained in bf16 (bf16 has fp32's range, so nothing there kept them small). fp16 tops
    out at 65504: those activations become inf, and inf − inf in the softmax makes the loss NaN.
    """
    model = tiny_mlp(seed)
    with torch.no_grad():
        model[0].weight.mul_(scale)
        model[2].weight.mul_(scale)
    x, y = random_batch(0, 0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        m = tiny_mlp(seed).to(dtype)
        m.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
        with torch.no_grad():
            hidden = m[1](m[0](x.to(dtype)))
            logits = m[2](hidden)
            loss = torch.nn.functional.cross_entropy(logits, y)   # computed in the low precision itself
        rows.append({"dtype": dtype_name(dtype), "max |activation|": float(hidden.float().abs().max()),
                     "max |logit|": float(logits.float().abs().max()), "loss": float(loss.float()),
                     "finite": bool(torch.isfinite(loss).item())})
    return rows


def precision_support() -> dict[str, Any]:
    """What this machine supports, detected: fp16/bf16 in DeepSpeed's accelerator, TF32, apex (for "amp")."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    gpu = torch.cuda.is_available()
    capability = torch.cuda.get_device_capability() if gpu else None
    return {
        "accelerator": acc.device_name(),
        "bf16 (DeepSpeed accelerator)": bool(acc.is_bf16_supported()),
        "fp16 (DeepSpeed accelerator)": bool(acc.is_fp16_supported()),
        "cpu native fp16 (mkldnn)": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
        "tf32 (Ampere+ GPU)": bool(capability and capability[0] >= 8),
        "apex installed (\"amp\" section)": importlib.util.find_spec("apex") is not None,
    }


def skipped_steps(overflows: list[bool]) -> list[int]:
    """The step indices that overflowed (and were therefore skipped)."""
    return [i for i, o in enumerate(overflows) if o]


def plot_scale_traces(traces: dict[str, Any], title: str = "loss scale per step"):
    """Loss scale (log2) and learning rate per step for each run (label → ``Trace`` of
    scripts/06_mixed_precision.py); skipped steps marked with ×."""
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_lr) = plt.subplots(1, 2, figsize=(11, 3.6))
    for label, t in traces.items():
        steps = range(len(t.scale))
        line, = ax_s.step(steps, [math.log2(s) for s in t.scale], where="post", label=label)
        skipped = skipped_steps(t.overflow)
        ax_s.plot(skipped, [math.log2(t.scale[i]) for i in skipped], "x", color=line.get_color())
        ax_lr.plot(steps, t.lr, label=label, color=line.get_color())
    ax_s.set(xlabel="step", ylabel="log2(loss scale)", title=title + " (× = overflow, step skipped)")
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate (the scheduler waits on skipped steps)")
    ax_s.legend(fontsize=8)
    ax_lr.legend(fontsize=8)
    fig.tight_layout()
    return fig
