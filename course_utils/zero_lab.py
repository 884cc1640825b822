"""The course model and the ZeRO experiments that notebooks 03 and 04 launch.

One GPT-2 built from a config (no download), random tokens as data, and small helpers the rank
scripts share: a config for a given stage/dtype/offload, one training step, and a measurement of
what the engine holds at the moment model states peak (after backward, before the optimizer step).
"""
from __future__ import annotations

import copy
import gc
import os
import time
from typing import Any

# ~13.8 M parameters: big enough that model states dwarf everything else, small enough for 2 CPU cores
MODEL = {"vocab_size": 8192, "n_positions": 128, "n_embd": 384, "n_layer": 6, "n_head": 6}
SEQ_LEN = 64
BASE_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
    "steps_per_print": 1_000_000,
    "wall_clock_breakdown": False,
}


def build_model(seed: int = 0, **overrides: Any):
    """The course GPT-2 (``GPT2LMHeadModel``) from a ``GPT2Config``: same seed, same weights on every rank."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(**{**MODEL, **overrides}, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def num_params(model) -> int:
    """Ψ: the number of distinct trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def ds_config(stage: int, dtype: str = "bf16", base: dict | None = None, **zero: Any) -> dict:
    """A DeepSpeed config for ``stage`` and ``dtype`` ("fp32" | "bf16" | "fp16"); extra keyword
    arguments go into ``zero_optimization``."""
    cfg = copy.deepcopy(base or BASE_CONFIG)
    cfg["zero_optimization"] = {**cfg.get("zero_optimization", {}), "stage": stage, **zero}
    for key in ("bf16", "fp16"):
        cfg.pop(key, None)
    if dtype in ("bf16", "fp16"):
        cfg[dtype] = {"enabled": True}
    return cfg


def batch(engine, seed: int = 0):
    """Random token ids for one micro-batch on the engine's device (labels = inputs: next-token loss)."""
    import torch

    g = torch.Generator().manual_seed(seed + engine.global_rank)
    vocab = engine.module.config.vocab_size
    ids = torch.randint(0, vocab, (engine.train_micro_batch_size_per_gpu(), SEQ_LEN), generator=g)
    return ids.to(engine.device)


def forward_backward(engine, step: int = 0) -> float:
    ids = batch(engine, step)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    return float(loss)


def accelerator_bytes() -> dict[str, int]:
    """Allocated / peak bytes on the accelerator (0 on a CPU-only machine)."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return {"allocated": 0, "peak": 0}
    return {"allocated": int(acc.memory_allocated()), "peak": int(acc.max_memory_allocated())}


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release(engine) -> None:
    """Drop an engine and everything it holds before the next one is built in the same process."""
    from deepspeed.accelerator import get_accelerator

    engine.destroy() if hasattr(engine, "destroy") else None
    del engine
    gc.collect()
    get_accelerator().empty_cache()
