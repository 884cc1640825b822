"""Inside the ranks of notebook 17's memory launches: the tiny Llama under ZeRO-3 and Ulysses at any SP size, one
length trained and measured, and ALST's tiled MLP and tiled logits+loss beside the plain ones.

**One SP size per launch, the world size** (:func:`engine_for`): at SP 1 the plain engine; above it the model's
attention goes through ``UlyssesSPAttentionHF`` (registered with ``seq_length_is_variable=True``, so one engine trains
every length: its ``forward`` reads the local length from each query) and ``mpu`` is passed to
``deepspeed.initialize``. Every length's samples come through ``UlyssesSPDataLoaderAdapter`` at every SP size (at SP 1
over the one-rank world group): the same labels shifted by the adapter, the same loss — the SP group's sum of token
losses over its token count — so that what differs between the launches is the sequence parallelism alone.

**What a rank holds per token.** Outside attention a rank works on its shard, ``length / SP`` tokens: embeddings,
norms, the MLP and, largest here, the logits (``VOCAB`` floats a token) with their softmax and gradient. Inside
attention, after the all-to-all, it holds the *whole* length for its share of the heads (``_combine_local_sequences``):
``HEADS / SP`` query heads and ``max(1, KV_HEADS / SP)`` key/value heads — past SP = ``KV_HEADS`` each rank holds a
whole key/value head of its own (``repeat_interleave`` by ``kv_replication_factor``), which no SP size divides
further; and every attention call all-gathers the full ``position_ids``.

**Tiling** (:func:`shard_loss`, :func:`tiling_comparison`): the MLP through ``TiledMLP`` (patched on this engine's
MLP instances only, as the ``TiledMLP`` docstring's Llama example does for the class), the logits and loss through
``TiledFusedLogitsLoss``, each pass of the real engine measured by the rank's own limit (:class:`Meter`).
"""
from __future__ import annotations

import gc
import math
import time
import types
from contextlib import contextmanager
from typing import Iterator

import torch

from course_utils.common.records.long_context_memory import CONFIG, KERNELS, ZERO_KEYS, TilingComparison
from course_utils.rank import long_context as lc


# ---------------------------------------------------------------- the engine at one SP size

def sp_group(sp: int):
    """The sequence-parallel group of this launch: the one ``register_with_transformers`` made above SP 1, the world
    (one rank) at SP 1."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    return groups._get_sequence_parallel_group() if sp > 1 else dist.group.WORLD


def register(sp: int):
    """Ulysses registered with transformers over ``sp`` ranks for sequences of any length (``mpu``; None at SP 1).
    Once per process: it makes the SP groups and replaces transformers' ``"sdpa"`` attention function."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    return UlyssesSPAttentionHF.register_with_transformers(lc.build(), "sdpa", sequence_parallel_size=sp,
                                                           micro_batch_size=1, seq_length_is_variable=True)


def engine_for(sp: int, dtype: str, mpu=None):
    """The tiny Llama under notebook 17's engine config (``configs/17_long_context.json``: ZeRO-3, AdamW) with small
    buckets, and Ulysses attention over ``sp`` ranks (none at SP 1); ``mpu``: the groups of an earlier
    :func:`register` (else it registers now)."""
    import deepspeed

    from course_utils.common import paths
    from course_utils.rank.scaffolding import read_config

    model = lc.build()
    mpu = mpu if mpu is not None else register(sp)
    config = read_config(paths.CONFIGS / CONFIG)
    config["zero_optimization"].update(ZERO_KEYS)
    if dtype != "fp32":
        config[dtype] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, mpu=mpu)
    # what the process holds now (the libraries' modules, the engine) lives until it ends: freezing it leaves the
    # collection before each measurement (``Meter.start``, ``free_memory``) only the objects made since — what the
    # lengths make and free — instead of millions of objects torch, transformers and DeepSpeed imported
    gc.collect()
    gc.freeze()
    return engine


def grow(engine, sp: int, lengths, steps: int, meter: "Meter", cap_bytes: int, kernel: str = "default") -> None:
    """Train ``lengths`` in this order, recording an attempt before each and its trial after, until the limit ends
    the rank (a length past it never gets its trial)."""
    from course_utils.common.record import record
    from course_utils.common.records.long_context_memory import LengthAttempt, LengthTrial
    from course_utils.rank.scaffolding import rank0_print

    for length in lengths:
        record(LengthAttempt(sp, length))
        meter.start()
        try:
            losses, seconds, attention = train_length(engine, sp, length, steps, kernel)
        except Exception as err:        # the limit's OutOfMemoryError, also where autograd's engine re-raised it
            if meter.counter.refused is None:
                raise
            out_of_memory(sp, length, err, meter.counter)
        peak = meter.base + meter.rise()
        record(LengthTrial(sp, length, length // sp, peak, meter.base, seconds, losses, attention, kernel, cap_bytes))
        rank0_print(f"{length:>6} tokens ({length // sp} a rank): loss {losses[-1]:.3f}, {max(seconds):.2f} s a step, "
                    f"peak {peak / 2**20:.0f} MiB")


def out_of_memory(sp: int, length: int, err: Exception, counter) -> None:
    """End this rank at the length its limit refused: a :class:`LengthRefused` record and one line (the launcher then
    ends the other ranks, which may be waiting for it in a collective), as a GPU rank ends at its allocator's
    ``OutOfMemoryError``. Under the course's runner the rank also leaves the failure record the rank hook leaves for
    an uncaught exception (``failures/rank<N>.json``): once every rank has ended so, the runner ends the launch at
    once instead of waiting for the launcher's polling and shutdown."""
    import os
    import sys
    import time

    from course_utils.common import run_folder
    from course_utils.common.record import record
    from course_utils.common.records.long_context_memory import LengthRefused

    record(LengthRefused(sp, length, *counter.refused, counter.cap_bytes))
    print(f"{length} tokens: {type(err).__module__}.{type(err).__name__}: {err}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if "RANK" in os.environ:
        run_folder.write_failure(os.environ["RANK"], time.time(), err)
    os._exit(1)         # no interpreter shutdown: gloo's threads may be waiting on a rank that ended


def length_batches(engine, sp: int, length: int, steps: int) -> Iterator[dict]:
    """``steps`` micro-batches of ``length`` tokens, this rank's shard of each (the adapter gathers one sample from
    every SP rank and hands out a shard of each in turn, so every rank holds samples r, r + SP, …)."""
    import itertools

    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from torch.utils.data import DataLoader

    rank = dist.get_rank(sp_group(sp))
    samples = [lc.sample(i, length) for i in range(rank, sp * math.ceil(steps / sp), sp)]
    adapter = UlyssesSPDataLoaderAdapter(DataLoader(samples, batch_size=1), sp_rank=rank, sp_group=sp_group(sp),
                                         sp_world_size=sp, device=engine.device)
    return itertools.islice(adapter, steps)


NO_LOGITS = torch.zeros(0, dtype=torch.long)    # ``logits_to_keep``: the LM head on no position


def shard_loss(engine, sp: int, batch: dict, tile_mlp: bool = False, tile_loss: bool = False) -> torch.Tensor:
    """The loss this rank gives ``engine.backward``: its own sum of token losses over the SP group's token count,
    times SP. The SP ranks' values average to the mean token loss of the whole sequence, and their gradients must
    be *summed* to make its gradient — but ZeRO-3 averages them, as over data-parallel replicas: with its default
    ``reduce_scatter`` it reduces through ``reduce_scatter_coalesced``, which divides by the group's size
    (``DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads``; its other path, ``__avg_scatter_contiguous_grads``, divides
    by the size over SP instead). transformers' Trainer makes up for it the same way, through a differentiable
    all-gather of the ranks' losses (``integrations.deepspeed.deepspeed_sp_compute_loss``).

    ``tile_mlp``: the MLPs through ``TiledMLP`` (:func:`tiled_mlps`). ``tile_loss``: the model's forward stops before
    its LM head (``logits_to_keep`` of no position; the last of ``hidden_states`` is the final norm's output) and the
    logits and loss go through ``TiledFusedLogitsLoss`` (:func:`tiled_logits_loss`)."""
    import contextlib

    import torch.distributed as dist

    ids, positions, labels = (batch[k].to(engine.device) for k in ("input_ids", "position_ids", "shift_labels"))
    count = (labels != -100).sum().to(torch.float32)
    dist.all_reduce(count, group=sp_group(sp))
    with tiled_mlps(engine.module) if tile_mlp else contextlib.nullcontext():
        if not tile_loss:
            return lc.token_loss_sum(engine(input_ids=ids, position_ids=positions).logits, labels)[0] * sp / count
        hidden = engine(input_ids=ids, position_ids=positions, logits_to_keep=NO_LOGITS.to(engine.device),
                        output_hidden_states=True).hidden_states[-1]
    return tiled_logits_loss(engine.module, hidden, labels, mlp_shards(ids.shape[1], hidden.shape[-1]), count / sp)


def whole_mean(loss: torch.Tensor, sp: int) -> float:
    """The mean token loss of the whole sequence from each rank's :func:`shard_loss`."""
    import torch.distributed as dist

    whole = loss.detach().clone()
    dist.all_reduce(whole, group=sp_group(sp))
    return float(whole) / sp


def train_step(engine, sp: int, batch: dict) -> float:
    """One optimizer step on one micro-batch; returns the mean token loss
    over the whole sequence."""
    loss = shard_loss(engine, sp, batch)
    engine.backward(loss)
    engine.step()
    return whole_mean(loss, sp)


def train_length(engine, sp: int, length: int, steps: int,
                 kernel: str = "default") -> tuple[list[float], list[float], dict]:
    """(losses, wall seconds, the first attention call's inputs: :func:`attention_inputs`) of ``steps`` optimizer steps
    at ``length`` with the attention ``kernel`` (:func:`attention_kernel`)."""
    from course_utils.rank.engine import free_memory

    losses, seconds, seen = [], [], []
    with attention_kernel(kernel), attention_inputs(seen):
        for batch in length_batches(engine, sp, length, steps):
            started = time.perf_counter()
            losses.append(train_step(engine, sp, batch))
            seconds.append(time.perf_counter() - started)
    del batch
    free_memory()           # the next length starts from what the engine holds, not from this one's leftovers
    return losses, seconds, seen[0]


@contextmanager
def attention_kernel(kernel: str) -> Iterator[None]:
    """The kernel of ``scaled_dot_product_attention`` while the block runs: ``"default"``, the one torch picks (for a
    causal call without a mask, a flash kernel: memory linear in the length), or ``"math"``, the composite kernel that
    makes each head's whole length × length scores and keeps their softmax for the backward pass — what torch falls
    back to when no fused kernel takes the call (``torch.nn.attention.sdpa_kernel``)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r}: choose one of {KERNELS}")
    if kernel == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        yield


@contextmanager
def attention_inputs(seen: list) -> Iterator[None]:
    """While the block runs, append the query, key and value shapes of every attention call to ``seen`` (each
    ``[batch, heads, length, head size]``, as this rank's attention kernel gets them, after Ulysses' all-to-all).
    transformers' sdpa integration looks ``torch.nn.functional.scaled_dot_product_attention`` up at each call, so
    wrapping it there sees every call; the wrapper only reads shapes and calls the original."""
    original = torch.nn.functional.scaled_dot_product_attention

    def probe(query, key, value, *args, **kwargs):
        seen.append({"query": list(query.shape), "key": list(key.shape), "value": list(value.shape),
                     "element_size": query.element_size()})
        return original(query, key, value, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = probe
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


# ---------------------------------------------------------------- tiling

def mlp_shards(seq_len: int, hidden: int, group=None) -> int:
    """The ``TiledMLP`` docstring's number of shards, ``ceil(seq_len / hidden)``: each shard is at most ``hidden``
    tokens, so its intermediate activations are no larger than one of the MLP's weight matrices. Agreed over ``group``
    by its maximum: every rank of a ZeRO-3 engine must gather the MLP's weights the same number of times."""
    import torch.distributed as dist

    shards = math.ceil(seq_len / hidden)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        agreed = torch.tensor(shards)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        shards = int(agreed)
    return shards


def _tiled_mlp_forward(mlp, x):
    """``LlamaMLP.forward`` through ``TiledMLP``: the MLP on ``mlp_shards`` slices of the sequence, its intermediate
    activations recomputed in the backward pass instead of kept."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    return TiledMLP.apply(type(mlp).forward, mlp, x, mlp_shards(x.shape[-2], x.shape[-1]),
                          [mlp.down_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight])


@contextmanager
def tiled_mlps(model) -> Iterator[None]:
    """Every MLP of ``model`` (this instance only, not the ``LlamaMLP`` class) tiled while the block runs."""
    mlps = [layer.mlp for layer in model.model.layers]
    for mlp in mlps:
        mlp.forward = types.MethodType(_tiled_mlp_forward, mlp)
    try:
        yield
    finally:
        for mlp in mlps:
            del mlp.forward          # back to the class's forward


def tiled_logits_loss(model, hidden: torch.Tensor, shift_labels: torch.Tensor, shards: int,
                      count: torch.Tensor | None = None) -> torch.Tensor:
    """The sum of the token losses of ``hidden`` through the LM head over ``count`` (default: the tokens with a label
    here; :func:`shard_loss` passes the SP group's count over SP), ``shards`` slices at a time, without the whole
    logits.

    ``TiledFusedLogitsLoss`` runs each shard's backward inside its forward with an incoming gradient of 1 (for
    ``"sum"``): the LM head's weight gradient is final when the call returns, and only the gradient to ``hidden`` is
    scaled by what comes from above (``TiledFusedLogitsLoss.backward``). So the mean is taken *inside* the shard
    function — each shard's sum over the whole sequence's token count — and the shards' results are summed, never
    divided afterwards (which would scale the hidden states' gradient and leave the LM head's unscaled)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    count = (shift_labels != -100).sum() if count is None else count

    def part_of_mean(lm_head, x, y):
        return lc.token_loss_sum(lm_head(x), y)[0] / count

    return TiledFusedLogitsLoss.apply(part_of_mean, model.lm_head, hidden, shift_labels, None, shards,
                                      [model.lm_head.weight], "sum")


TILING_SETTINGS = {"plain": (False, False), "TiledMLP": (True, False), "TiledFusedLogitsLoss": (False, True),
                   "both": (True, True)}


class Meter:
    """What a rank's limit counts over one block: the peak of its tensor bytes (``course_utils.rank.tensor_bytes``)
    over what it held at the start."""

    def __init__(self, counter):
        self.counter, self.base = counter, 0

    def start(self) -> None:
        from course_utils.rank.engine import free_memory

        free_memory()
        self.counter.reset_peak()
        self.base = self.counter.count

    def rise(self) -> int:
        return self.counter.peak - self.base


def count_limit(cap_mb: int) -> tuple[object, Meter]:
    """This rank's limit: ``cap_mb`` MiB of tensors, counted by a ``TensorBytes`` mode (enter ``meter.counter``
    before building the engine); record it, and return it with the :class:`Meter` that reads it."""
    from deepspeed.accelerator import get_accelerator

    from course_utils.common.record import record
    from course_utils.common.records.bigger import Limit
    from course_utils.rank.tensor_bytes import TensorBytes

    limit = Limit("tensor", cap_mb * 2**20, get_accelerator().device_name())
    record(limit)
    return limit, Meter(TensorBytes(limit.cap_bytes))


def tiling_comparison(engine, sp: int, length: int, meter: Meter) -> TilingComparison:
    """One forward and backward pass of the engine at ``length`` with and without each tiling
    (:data:`TILING_SETTINGS`), no optimizer step: the rise of the rank's limit (``meter``), the loss, and how far
    each setting's loss and gradients (whole, ``safe_get_full_grad``) are from the plain pass's.

    Measured by the limit, not by torch's ``MemTracker``, which cannot count a tiled pass: it refuses a module called
    more than once in a pass (``MemTracker._pre_fw_hook``: "multiple iterative calls"), and its module tracker fails
    on a module called on a view made without gradients, as ``TiledMLP.forward`` calls the MLP's linears
    (``ModTracker._fw_pre_hook`` → ``register_multi_grad_hook``: "Expected gradient function to be set")."""
    from deepspeed.utils import safe_get_full_grad

    batch = next(length_batches(engine, sp, length, 1))
    peaks, losses, grad_diff, loss_diff, seconds, plain = {}, {}, {}, {}, {}, None
    for name, (tile_mlp, tile_loss) in TILING_SETTINGS.items():
        meter.start()
        started = time.perf_counter()
        loss = shard_loss(engine, sp, batch, tile_mlp, tile_loss)
        engine.backward(loss)
        seconds[name], peaks[name] = time.perf_counter() - started, meter.rise()
        grads = [safe_get_full_grad(p).clone() for p in engine.module.parameters()]
        engine.optimizer.zero_grad()
        whole = whole_mean(loss, sp)
        if plain is None:
            plain = whole, grads
        losses[name], loss_diff[name] = whole, abs(whole - plain[0])
        grad_diff[name] = max(float((g - p).abs().max()) for g, p in zip(grads, plain[1]))
        del loss, grads
    shards = mlp_shards(length // sp, engine.module.config.hidden_size)
    return TilingComparison(length, shards, peaks, losses, grad_diff, loss_diff, seconds)
