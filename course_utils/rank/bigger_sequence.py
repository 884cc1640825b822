"""Inside the rank of notebook 16's long sequence: one ZeRO-3 + CPU offload engine under the notebook's limit, and one
training step per pass on a sequence short or long, with transformers' activation checkpointing on or off.

**Which checkpointing, and why transformers'.** Two things are called activation checkpointing here:

- transformers' ``PreTrainedModel.activation_checkpointing_enable()`` (``gradient_checkpointing_enable()`` is its
  deprecated alias, ``transformers/modeling_utils.py``) sets ``gradient_checkpointing`` on every
  ``GradientCheckpointingLayer`` (each ``GPT2Block``), whose ``forward`` then runs through
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (``transformers/modeling_layers.py``): the forward
  keeps each block's input only and the backward runs the block again. It can be switched on and off on a model that
  an engine already wraps: it only sets flags the next forward reads;
- DeepSpeed's ``activation_checkpointing`` config section is read into ``DeepSpeedConfig.activation_checkpointing_config``
  (``deepspeed/runtime/config.py``) and used only by ``deepspeed.checkpointing.configure`` (``_configure_using_config_file``
  in ``deepspeed/runtime/activation_checkpointing/checkpointing.py``), for code that calls
  ``deepspeed.checkpointing.checkpoint`` itself (Megatron-style models, ``PipelineModule``). ``deepspeed.initialize``
  never calls ``configure``, and no transformers model calls ``deepspeed.checkpointing.checkpoint``: for a Hugging Face
  model the section alone changes nothing. Each pass records ``deepspeed.checkpointing.is_configured()`` and the blocks
  transformers checkpoints, so the notebook shows this rather than saying it.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from course_utils.common.record import record
from course_utils.common.records.bigger import HEADS, LR, VOCAB, Limit, zero_keys
from course_utils.common.records.bigger_sequence import (CONFIGURATION, DS_SECTION, N_EMBD, N_LAYER, BlockMemory,
    Pass, PassResult)
from course_utils.rank.bigger import charged, limit_peak, sizes_of, start_peak


def gpt2_config(positions: int):
    """The narrow, deep GPT-2 of the long sequence, with ``positions`` positions, no dropout and no KV cache."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=positions, n_embd=N_EMBD, n_layer=N_LAYER, n_head=HEADS,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, use_cache=False)


def engine_for(positions: int, dtype: str):
    """The model under notebook 16's ZeRO-3 + offload (CPU) configuration, with DeepSpeed's ``activation_checkpointing``
    section in its config (:data:`DS_SECTION`); built inside ``zero.Init`` as notebook 16 builds its sizes. Returns
    (engine, the HfDeepSpeedConfig to keep alive)."""
    import deepspeed
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.integrations import HfDeepSpeedConfig

    from course_utils.rank.engine import ds_config

    stage, keys = zero_keys(CONFIGURATION)
    config = ds_config(stage, dtype, micro_batch=1, **keys)
    config["optimizer"]["params"]["lr"] = LR
    config["activation_checkpointing"] = dict(DS_SECTION)
    torch.manual_seed(0)
    keep_alive = HfDeepSpeedConfig(config)
    model = GPT2LMHeadModel._from_config(gpt2_config(positions))
    model.loss_type = "ForCausalLM"     # GPT-2 names no loss type, and transformers warns before taking this default
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.train()
    return engine, keep_alive


def memory_now(limit: Limit, cgroup_procs: str | None) -> int:
    """What the limit counts now: the cgroup's charge on a CPU; on a GPU the bytes tensors hold on the device (the
    capped allocator's reserve rounds them up to its blocks and keeps freed ones cached, which would blur a
    block-by-block count)."""
    if limit.kind == "cgroup":
        return charged(cgroup_procs)
    if limit.kind == "cuda":
        import torch

        return torch.cuda.memory_allocated()
    return 0


@contextmanager
def block_memory(blocks: list, name: str, limit: Limit, cgroup_procs: str | None) -> Iterator[None]:
    """Record :class:`BlockMemory` after each block's forward. transformers checkpoints a block's ``forward``, not its
    ``__call__``, so the hook runs once per block in the forward and not again when the backward recomputes it."""
    def after(index: int):
        return lambda module, inputs, output: record(BlockMemory(name, index, memory_now(limit, cgroup_procs)))

    handles = [block.register_forward_hook(after(i)) for i, block in enumerate(blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_pass(engine, name: str, tokens: int, checkpointing: bool, limit: Limit, cgroup_procs: str | None) -> PassResult:
    """One training step (forward, backward, optimizer step) on one sequence of ``tokens`` tokens, with transformers'
    activation checkpointing on or off; records the :class:`Pass` before and the :class:`PassResult` after."""
    import deepspeed
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    model = engine.module
    if checkpointing:
        model.activation_checkpointing_enable()
    else:
        model.activation_checkpointing_disable()
    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    start_peak(limit, cgroup_procs)
    held = memory_now(limit, cgroup_procs)
    record(Pass(name, tokens, sizes_of(model)[0], sum(b.gradient_checkpointing for b in blocks), len(blocks),
                bool(deepspeed.checkpointing.is_configured()), "activation_checkpointing" in engine.config, held))
    ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(0)).to(engine.device)
    started = time.perf_counter()
    with block_memory(blocks, name, limit, cgroup_procs):
        loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    result = PassResult(name, tokens, float(loss.detach()), time.perf_counter() - started, limit_peak(limit, cgroup_procs))
    record(result)
    return result
