"""Where a step's time and memory go, measured inside a rank (notebook 11).

- :func:`micro_batches`: one optimizer step's samples, of different lengths, cut into micro-batches, so that any
  micro-batch × accumulation × ranks split of the same effective batch trains on the same samples.
- :func:`hand_gradients` and :func:`fit`: each micro-batch's gradient by plain torch, and how an engine's update
  compares with an update computed from them (the hand-written accumulation loops of section 1).
- :func:`counting_batch`: the profiled engine's batches: sequences with a rule to learn, so its loss falls.
- :func:`activation_memory`: the bytes a forward and backward pass hold, by torch's own memory tracker
  (``torch.distributed._tools.mem_tracker.MemTracker``), with or without activation checkpointing.
- :func:`matmul_flops_per_s`: what this rank's CPU (or GPU) does at its best, from a matmul benchmark.
- :func:`module_rows`: what DeepSpeed's flops profiler counted, per top-level module of the model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from course_utils.rank.data import global_batch


def micro_batches(step: int, rank: int, world_size: int, micro: int, gas: int) -> list[dict]:
    """The ``gas`` micro-batches of ``micro`` samples that ``rank`` trains on in optimizer step ``step``, each a dict
    of ``input_ids`` and ``labels`` for a causal language model.

    The effective batch is ``micro × gas × world_size`` samples of :func:`data.global_batch`; each rank takes a
    contiguous share of it and cuts that share into micro-batches, so 8 × 1, 4 × 2 and 2 × 4 on 2 ranks all
    train on the same 16 samples in each step. The samples have different lengths, as text has: sample ``i`` ends
    after :func:`sample_length` tokens and is padded to the preset's length; its labels are -100 (skipped by the
    loss) on the padding and on the first token, which nothing predicts, so a micro-batch's loss is the mean over
    the tokens it labels, and micro-batches label different numbers of them."""
    import torch

    batch = global_batch(step, micro * gas * world_size)
    first = step * len(batch)
    ends = torch.tensor([sample_length(first + i, batch.shape[1]) for i in range(len(batch))])
    inside = torch.arange(batch.shape[1]) < ends[:, None]
    ids = torch.where(inside, batch, torch.zeros_like(batch))
    labels = torch.where(inside, batch, torch.full_like(batch, -100))
    labels[:, 0] = -100
    share = slice(rank * micro * gas, (rank + 1) * micro * gas)
    ids, labels = ids[share], labels[share]
    return [{"input_ids": ids[i * micro:(i + 1) * micro], "labels": labels[i * micro:(i + 1) * micro]}
            for i in range(gas)]


def sample_length(index: int, longest: int) -> int:
    """How many tokens sample ``index`` of :func:`micro_batches` has before its padding: 2 to ``longest``, the same
    in every run."""
    import torch

    return int(torch.randint(2, longest + 1, (1,), generator=torch.Generator().manual_seed(10_000 + index)))


def hand_gradients(model, batches: list[dict]) -> list:
    """Each micro-batch's gradient of its loss at the model's weights (which it leaves unchanged), by plain torch
    autograd, no DeepSpeed: flattened in float64, in ``model.parameters()`` order, and averaged over the ranks, as the
    engine's all-reduce averages them."""
    import torch
    import torch.distributed as dist

    gradients = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        g = torch.cat([p.grad.detach().double().flatten() for p in model.parameters()])
        dist.all_reduce(g)
        gradients.append(g / dist.get_world_size())
    return gradients


def fit(update, reference) -> list[float]:
    """``update ≈ factor × reference`` by least squares: ``[factor, |update − factor × reference| / |reference|]``
    (the left over is 0 when the update is the reference scaled, whatever the factor)."""
    factor = float(update @ reference / (reference @ reference))
    return [factor, float((update - factor * reference).norm() / reference.norm())]


def counting_batch(step: int, rank: int, micro: int, seq_len: int, vocab: int = 64):
    """``micro`` sequences of ``seq_len`` token ids that count upward by one from a random start, modulo ``vocab``
    (the first 64 of ``zero_lab``'s 8192 tokens): after token t always comes t + 1, a rule the model can learn, so
    the loss the monitor logs falls for that reason (random tokens would leave nothing to learn). Different per step
    and rank, the same in every run."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    starts = torch.randint(0, vocab, (micro, 1), generator=g)
    return (starts + torch.arange(seq_len)) % vocab


@dataclass
class ActivationMemory:
    """Bytes of one forward + backward pass of a model, by category (MemTracker's: parameters, gradients,
    activations, temporaries)."""
    after_forward: dict        # category → bytes alive when the forward pass has ended
    peak: dict                 # category → bytes at the moment the total was largest
    seconds: float             # wall time of the pass (under the tracker: slower than a real step)


def _by_category(snapshot: dict, device) -> dict:
    """MemTracker's snapshot (device → category → bytes) for the model's ``device``: on a GPU its CUDA bytes,
    not those of the few CPU tensors a pass may also create."""
    import torch

    found = {torch.device(d): v for d, v in snapshot.items()}.get(torch.device(device), {})
    return {getattr(k, "value", k): int(v) for k, v in found.items()}


def activation_memory(model, ids) -> ActivationMemory:
    """Track every tensor that one forward and backward pass of ``model`` on ``ids`` creates (torch's
    ``MemTracker``, a ``TorchDispatchMode``): what is alive after the forward pass, and the peak."""
    import warnings

    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, ids)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            loss = model(input_ids=ids, labels=ids).loss
            after_forward = _by_category(tracker.get_tracker_snapshot("current"), ids.device)
            loss.backward()
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return ActivationMemory(after_forward, _by_category(tracker.get_tracker_snapshot("peak"), ids.device), seconds)


def interleaved_passes(model, ids, settings: list[str], repeats: int, deepspeed_config: dict | None = None) -> dict:
    """Forward + backward passes of ``model`` on ``ids`` under each checkpointing setting, interleaved (A B C A B
    C …, ``repeats`` rounds after one warm-up round), so that a slow moment of the machine falls on every
    setting alike. Per setting, one list entry per timed pass: ``forward`` and ``backward`` seconds (the backward
    of a checkpointed block runs its forward again) and ``minor_faults``, the page faults the pass took
    (``getrusage``: memory the allocator had to get fresh from the kernel and touch for the first time)."""
    import resource

    out = {how: {"forward": [], "backward": [], "minor_faults": []} for how in settings}
    for round_ in range(repeats + 1):
        for how in settings:
            set_checkpointing(model, how, deepspeed_config)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            started = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            forward_done = time.perf_counter()
            loss.backward()
            ended = time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            model.zero_grad(set_to_none=True)
            if round_:
                for key, value in (("forward", forward_done - started), ("backward", ended - forward_done),
                                   ("minor_faults", faults)):
                    out[how][key].append(value)
    return out


def set_checkpointing(model, how: str, deepspeed_config: dict | None = None) -> None:
    """``how``: "off"; "hf" (transformers' ``activation_checkpointing_enable()``: ``torch.utils.checkpoint``,
    non-reentrant); "deepspeed" (the same layers through ``deepspeed.checkpointing.checkpoint``, configured from
    the config's ``activation_checkpointing`` section)."""
    if how == "off":
        model.activation_checkpointing_disable()
    elif how == "hf":
        model.activation_checkpointing_enable()
    elif how == "deepspeed":
        import deepspeed

        deepspeed.checkpointing.configure(None, deepspeed_config=deepspeed_config or {})
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
        model.enable_input_require_grads()
    else:
        raise ValueError(f'checkpointing is "off", "hf" or "deepspeed", not {how!r}')
    model.train()


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent outside idle (and I/O wait) since boot (``psutil.cpu_times``): taken
    before and after a timing, minus the process's own CPU time, it says what other programs took meanwhile."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def matmul_flops_per_s(device: str, n: int = 512, repeats: int = 5) -> float:
    """FLOP/s of an ``n``×``n`` fp32 matmul on this rank (2n³ FLOPs each), the best of ``repeats``: the peak
    this rank can reach with the threads it has, to divide achieved FLOP/s by (MFU)."""
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        started = time.perf_counter()
        (a @ b)[0, 0].item()
        best = min(best, time.perf_counter() - started)
    return 2 * n ** 3 / best


def module_rows(model) -> list[dict]:
    """What DeepSpeed's flops profiler counted in the forward pass it has just profiled (the engine's profile
    step, before ``engine.step()`` ends the profile): forward FLOPs, parameters and latency of the whole model
    and of each top-level module (the whole model's latency is the engine's ``fwd`` timer, not read here)."""
    from deepspeed.profiling.flops_profiler.profiler import get_module_duration, get_module_flops

    modules = [("(whole model)", model)] + list(_top_modules(model))
    return [{"module": name, "fwd_flops": int(get_module_flops(m)), "params": int(m.__params__),
             "latency_s": float(get_module_duration(m)) if m is not model else None} for name, m in modules]


def _top_modules(model):
    """The modules one level below the transformer body: embeddings, each block, the final norm, the head."""
    for name, child in model.named_children():
        if name == "transformer":
            for sub, grandchild in child.named_children():
                if sub == "h":
                    yield from ((f"transformer.h.{i}", block) for i, block in enumerate(grandchild))
                else:
                    yield f"transformer.{sub}", grandchild
        else:
            yield name, child
