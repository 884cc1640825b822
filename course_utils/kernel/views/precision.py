"""Notebook 06's demonstrations, tables and figure: what this machine supports, the fp16 overflow
pitfall, the bytes each precision's gradient all-reduce moved, the loss-scale traces the ranks recorded,
and the engine's learning rate on skipped steps."""
from __future__ import annotations

import math
from typing import Any

import torch

from course_utils.common.records.precision import GRAD_MESSAGE_MIN_BYTES, Trace
from course_utils.rank.engine import dtype_name, scaler_for
from course_utils.rank.data import random_batch
from course_utils.rank.models import tiny_mlp
from course_utils.common.record import read_as

FP16_MAX = torch.finfo(torch.float16).max       # 65504: anything larger becomes inf in fp16
BF16_MAX = torch.finfo(torch.bfloat16).max      # ~3.4e38: the same exponent range as fp32


def read_traces(records: list[dict]) -> dict[str, Any]:
    """Rank 0's loss-scaling runs, label → ``Trace`` (declared in :mod:`course_utils.common.records.precision`)."""
    return {t.label: t for t in read_as(records, Trace)}


def overflow_table(scale: float = 1000.0, seed: int = 0) -> list[dict[str, Any]]:
    """The NaN pitfall: one forward pass of the same weights in fp32, bf16 and fp16.

    Both layers' weights are multiplied by ``scale`` so that the logits reach ~1e5, as happens in models
    pre-trained in bf16 (bf16 has fp32's range, so nothing there kept them small), while the hidden
    activations stay in the thousands. fp16 tops out at 65504: the logits become inf, and inf − inf in the
    softmax makes the loss NaN.
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


def auto_cast_seen(batch: dict[str, torch.Tensor]) -> dict[str, dict[str, str]]:
    """What a module's ``forward`` receives when ``fp16.auto_cast`` is on, called the two ways a batch is passed.

    DeepSpeed registers ``DeepSpeedEngine._forward_prologue`` as a forward pre-hook (``with_kwargs=True``); with
    ``fp16_auto_cast()`` true it runs ``_cast_inputs_half`` on the positional ``inputs`` and returns ``kwargs``
    as they came. Here DeepSpeed's own hook is registered, by DeepSpeed's own method, on a module that records the
    dtypes it was given; the stand-in engine answers only what ``_forward_prologue`` asks (auto_cast on, every
    other feature off), so no engine and no process group is built. Returns ``{call: {name: dtype}}`` for
    ``engine(batch)`` (the dict as one positional argument) and ``engine(**batch)`` (keyword arguments).
    """
    from types import SimpleNamespace

    from deepspeed.runtime.engine import DeepSpeedEngine

    class Probe(torch.nn.Module):
        def forward(self, *args, **kwargs):
            given = args[0] if args else kwargs
            self.seen = {k: dtype_name(v.dtype) for k, v in given.items()}

    off = staticmethod(lambda *_: False)

    class AutoCastOnly:                        # what _forward_prologue reads: fp16.auto_cast on, the rest off
        _forward_prologue = DeepSpeedEngine._forward_prologue
        _cast_inputs_half = DeepSpeedEngine._cast_inputs_half
        _create_module_forward_pre_hook = DeepSpeedEngine._create_module_forward_pre_hook
        fp16_auto_cast = staticmethod(lambda: True)
        autotuning_profile_model_info = memory_breakdown = flops_profiler_enabled = off
        random_ltd_enabled = zero_optimization_partition_weights = off
        training_dataloader = None
        tput_timer = SimpleNamespace(start=lambda: None)
        engine_timers = SimpleNamespace(forward_timers=[])
        _start_timers = off

    engine = AutoCastOnly()
    engine.module = probe = Probe()
    engine._create_module_forward_pre_hook()
    probe(batch)
    positional = probe.seen
    probe(**batch)
    return {"engine(batch)": positional, "engine(**batch)": probe.seen}


def precision_support() -> dict[str, Any]:
    """What this machine supports, detected: fp16/bf16 in DeepSpeed's accelerator, native fp16 on the CPU, TF32."""
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
    }


def communication_table(rows: list[Any]) -> list[dict[str, Any]]:
    """Per precision (``EngineDtypes`` of scripts/06_mixed_precision.py), what DeepSpeed's comms logger saw in
    one training step: the gradient all_reduce bytes over Ψ (the bytes one gradient element took on the wire),
    the small all_reduce messages beside it, and the all_gather of this rank's updated partition."""
    min_bytes = GRAD_MESSAGE_MIN_BYTES
    table = []
    for r in rows:
        small = {size: n for size, n in r.messages.get("all_reduce", {}).items() if int(size) < min_bytes}
        gathers = r.messages.get("all_gather_into_tensor", {})
        table.append({"precision": r.precision, "module": r.module, "Ψ": r.psi,
                      "engine.communication_data_type": r.communication,
                      "gradient all_reduce bytes": r.grad_allreduce_bytes,
                      "bytes per element": r.grad_allreduce_bytes / r.psi,
                      f"all_reduce < {min_bytes} B (bytes: count)": small,
                      "all_gather bytes (this rank's shard)": sum(int(size) * n for size, n in gathers.items())})
    return table


def lr_table(run: Any) -> list[dict[str, Any]]:
    """The engine's scheduler run (``EngineLr`` of scripts/06_mixed_precision.py), one row per step."""
    return [{"step": i, f"rank {run.inf_rank}'s loss × inf": i in run.inf_steps, "engine.optimizer.overflow": o,
             "engine.skipped_steps": k, "scheduler iteration": it, "engine.get_lr()": lr}
            for i, (o, k, it, lr) in enumerate(zip(run.overflow, run.skipped_steps, run.scheduler_iteration, run.lr))]


def skipped_steps(overflows: list[bool]) -> list[int]:
    """The step indices that overflowed (and were therefore skipped)."""
    return [i for i, o in enumerate(overflows) if o]


def doublings(trace: Any) -> list[tuple[int, int]]:
    """(step, clean steps in a row before it) for each step of a ``Trace`` whose loss scale is larger than the
    step before's: the scaler doubled the scale after that earlier step."""
    found, last_overflow = [], -1
    for i in range(1, len(trace.scale)):
        if trace.overflow[i - 1]:
            last_overflow = i - 1
        if trace.scale[i] > trace.scale[i - 1]:
            found.append((i, i - 1 - last_overflow))
    return found


def plot_scale_traces(traces: dict[str, Any], title: str = "loss scale per step"):
    """Loss scale (log2) per step for each run (label → ``Trace`` of scripts/06_mixed_precision.py);
    skipped steps marked with ×."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, t in traces.items():
        line, = ax.step(range(len(t.scale)), [math.log2(s) for s in t.scale], where="post", label=label)
        skipped = skipped_steps(t.overflow)
        ax.plot(skipped, [math.log2(t.scale[i]) for i in skipped], "x", color=line.get_color())
    ax.set(xlabel="step", ylabel="log2(loss scale)", title=title + " (× = overflow, step skipped)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def updates_applied(trace: Any) -> list[int]:
    """After each step of a ``Trace``, how many steps so far were applied (not skipped for an overflow)."""
    out, applied = [], 0
    for overflow in trace.overflow:
        applied += not overflow
        out.append(applied)
    return out


def held_out_after_updates(trace: Any, updates: int) -> float:
    """A run's held-out loss right after the step that applied its ``updates``-th update (``updates`` ≥ 1): the
    point to compare two runs at when one of them skipped steps."""
    return trace.held_out[updates_applied(trace).index(updates)]


def loss_scaling_summary(traces: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per loss-scaling run: steps, skipped, updates applied, first clean step, final scale, and the held-out loss
    before the first step and after the last (a fixed batch no step trains on: the step losses go up and down with
    each step's batch)."""
    return {label: {"steps": len(t.overflow), "skipped": sum(t.overflow), "updates applied": updates_applied(t)[-1],
                    "first clean step": next((i for i, o in enumerate(t.overflow) if not o), None),
                    "final scale": t.scale[-1], "held-out loss after step 0": t.held_out[0],
                    "held-out loss at the end": t.held_out[-1]}
            for label, t in traces.items()}


def plot_held_out(traces: dict[str, Any]):
    """The held-out loss of each loss-scaling run against the step, and against the updates applied so far: a run
    that skipped steps is behind by exactly those steps when its curve lies on the others' in the second panel."""
    import matplotlib.pyplot as plt

    fig, (by_step, by_update) = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    for label, t in traces.items():
        by_step.plot(range(len(t.held_out)), t.held_out, label=label)
        by_update.plot(updates_applied(t), t.held_out, ".-", ms=3, label=label)
    by_step.set(xlabel="step", ylabel="held-out loss", title="held-out loss per step")
    by_update.set(xlabel="updates applied so far", title="the same losses against the updates applied")
    by_step.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_engine_lr(run: Any):
    """The engine's learning rate after each step of the scheduler run (``EngineLr``); skipped steps marked ×."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(range(len(run.lr)), run.lr, "o-", ms=3, label="engine.get_lr() after the step")
    skipped = skipped_steps(run.overflow)
    ax.plot(skipped, [run.lr[i] for i in skipped], "x", color="red", ms=9, label="skipped step (overflow)")
    ax.set(xlabel="step", ylabel="learning rate",
           title=f"{run.precision} engine, WarmupLR: the LR waits on skipped steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# Exercise 2: the loss scale before each step that DeepSpeed's DynamicLossScaler drew from these overflows, with an fp16
# section the notebook does not show and the course does not hold (its test, tests/test_precision_schedules.py, keeps it
# and checks that this scaler still draws this curve from it)
TARGET_OVERFLOWS = [c == "o" for c in "fffffofffofofffffooofffffffofff"]
TARGET_SCALES = [4096.0] * 5 + [8192.0] * 12 + [16384.0] * 3 + [8192.0] * 5 + [16384.0] * 6
SCALER_KEYS = ("initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale")


def scale_curve(fp16: dict, overflows: list[bool]) -> list[float]:
    """The loss scale before each step of DeepSpeed's own scaler, built from the ``fp16`` section as the ZeRO
    optimizer builds it (:func:`course_utils.rank.engine.scaler_for`: DeepSpeed's config class reads the section),
    given which steps overflowed.

    ``update_scale`` asks ``deepspeed.comm`` for the rank only to decide which rank logs the overflow; this kernel
    has no process group, so it is told rank 0 and its log lines are left out."""
    from unittest import mock

    from deepspeed.runtime.fp16 import loss_scaler

    scaler = scaler_for(fp16)
    scales = []
    with mock.patch.object(loss_scaler.dist, "get_rank", return_value=0), mock.patch.object(loss_scaler.logger, "info"):
        for overflow in overflows:
            scales.append(float(scaler.loss_scale))
            scaler.update_scale(overflow)
    return scales


def curve_problem(fp16, overflows: list[bool], target: list[float]) -> str:
    """Exercise 2's check: what keeps ``fp16`` from drawing ``target`` from ``overflows`` ('' when nothing does),
    read as DeepSpeed reads it; it names the first step where the curves part, never a setting's value."""
    from deepspeed.runtime.precision_config import get_float16_config

    if not isinstance(fp16, dict):
        return f"target_fp16() returned a {type(fp16).__name__}, not an fp16 section (a dict)."
    missing = [k for k in SCALER_KEYS if k not in fp16]
    if missing:
        return f"your section lacks {missing}."
    try:
        read = get_float16_config({"fp16": {"enabled": True, **fp16}})
    except Exception as e:                          # DeepSpeed's config class refuses the learner's section
        said = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'fp16'}: {err['msg']}" for err in e.errors()) \
            if hasattr(e, "errors") else str(e)
        return f"DeepSpeed's fp16 config class refuses your section: {said}."
    if read.loss_scale != 0:
        return (f"your section sets loss_scale to {read.loss_scale:g}: DeepSpeed then scales every step by that fixed "
                "number (a static LossScaler) and ignores the dynamic keys; 0 asks for the dynamic scaler.")
    try:
        yours = scale_curve(fp16, overflows)
    except (ArithmeticError, ValueError) as e:     # e.g. a scale of 2**4096: the power given as the scale
        return (f"DeepSpeed's scaler cannot run from your section ({type(e).__name__}: {e}): initial_scale_power is "
                "the power of 2 the scale starts at, not the scale.")
    parted = next((step for step, (a, b) in enumerate(zip(yours, target)) if a != b), None)
    return "" if parted is None else f"from the same overflows your section's scaler leaves the target curve at step {parted}."


def target_scale_curve() -> tuple[list[bool], list[float]]:
    """Exercise 2's target: the overflow flags and the scale curve DeepSpeed's scaler drew from them."""
    return list(TARGET_OVERFLOWS), list(TARGET_SCALES)
