"""Mixed precision, read from the objects that do it: engine dtypes, loss scales, overflows.

Notebook 06 and its script use these helpers so that every dtype and every scale it shows is read
from a live DeepSpeed engine or from DeepSpeed's own loss-scaler classes, never typed in.
"""
from __future__ import annotations

import importlib.util
from typing import Any

import torch

FP16_MAX = torch.finfo(torch.float16).max       # 65504: anything larger becomes inf in fp16
BF16_MAX = torch.finfo(torch.bfloat16).max      # ~3.4e38: the same exponent range as fp32


def tiny_mlp(seed: int = 0, width: int = 32, classes: int = 4) -> torch.nn.Module:
    """A small classifier (16 → width → classes): big enough to train, small enough for 2 CPU cores."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, classes))


def random_batch(step: int, rank: int, batch: int = 8, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A reproducible batch that differs per step and per rank (each rank sees its own shard)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(batch, 16, generator=g)
    return x, (x[:, :classes].argmax(dim=1))          # a learnable rule: the largest of the first features


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.bfloat16`` → ``"bfloat16"`` (JSON-friendly)."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def engine_dtypes(engine: Any) -> dict[str, str | None]:
    """The dtypes a ZeRO stage 1/2 engine really holds, read after a backward pass.

    - ``module``: the parameters the forward pass uses (what the model was cast to);
    - ``master``: the optimizer's own copy of this rank's partition (``single_partition_of_fp32_groups``);
    - ``grad``: the gradient the engine reduces (``param.grad`` before the step, or the optimizer's
      partitioned gradient buffer when the engine already moved it there);
    - ``communication``: the dtype gradients are all-reduced in.
    """
    param = next(p for p in engine.module.parameters() if p.requires_grad)
    opt = engine.optimizer
    master = getattr(opt, "single_partition_of_fp32_groups", None)
    grad = param.grad
    if grad is None and getattr(opt, "averaged_gradients", None):
        grad = next(iter(opt.averaged_gradients.values()))[0]
    return {"module": dtype_name(param.dtype),
            "master": dtype_name(master[0].dtype) if master else None,
            "grad": dtype_name(grad.dtype) if grad is not None else None,
            "communication": dtype_name(engine.communication_data_type)}


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


def plot_scale_traces(traces: dict[str, dict[str, list]], title: str = "loss scale per step"):
    """Loss scale (log2) and learning rate per step for each run; skipped steps marked with ×."""
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_lr) = plt.subplots(1, 2, figsize=(11, 3.6))
    for label, t in traces.items():
        steps = range(len(t["scale"]))
        line, = ax_s.step(steps, [torch.tensor(s).log2().item() for s in t["scale"]], where="post", label=label)
        skipped = skipped_steps(t["overflow"])
        ax_s.plot(skipped, [torch.tensor(t["scale"][i]).log2().item() for i in skipped], "x", color=line.get_color())
        ax_lr.plot(steps, t["lr"], label=label, color=line.get_color())
    ax_s.set(xlabel="step", ylabel="log2(loss scale)", title=title + " (× = overflow, step skipped)")
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate (the scheduler waits on skipped steps)")
    ax_s.legend(fontsize=8)
    ax_lr.legend(fontsize=8)
    fig.tight_layout()
    return fig
