"""The Hugging Face Trainer on DeepSpeed ranks, on GPUs and on CPU-only machines alike.

On GPUs, ``TrainingArguments(deepspeed=...)`` sets up the distributed state by itself. On a CPU-only
machine it does not: accelerate only joins a DeepSpeed process group when it sees an accelerator, so
every rank believes it is alone (world size 1) and DeepSpeed's batch-size check fails
(train_batch_size != micro_batch × grad_acc × world_size). The remedy, applied by
:func:`training_arguments`, is to build accelerate's ``PartialState`` for DeepSpeed over gloo
*first*, and tell the Trainer to use it (``accelerator_config={"use_configured_state": True}``).
"""
from __future__ import annotations

import os
from typing import Any

import torch


def prepare_cpu_state() -> None:
    """Join the launched ranks' process group (gloo) as accelerate's DeepSpeed state, on CPU only."""
    if torch.cuda.is_available():
        return
    from accelerate import PartialState

    previous = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"     # what TrainingArguments sets for DeepSpeed on GPUs
    try:
        PartialState(backend="gloo")
    finally:
        if previous is None:
            os.environ.pop("ACCELERATE_USE_DEEPSPEED")
        else:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = previous


def training_arguments(cls: type | None = None, **kwargs: Any):
    """``TrainingArguments`` (or ``cls``, e.g. Seq2SeqTrainingArguments) that work on GPU and CPU ranks."""
    from transformers import TrainingArguments

    cls = cls or TrainingArguments
    if not torch.cuda.is_available():
        prepare_cpu_state()
        config = dict(kwargs.pop("accelerator_config", None) or {})
        config["use_configured_state"] = True
        kwargs["accelerator_config"] = config
    kwargs.setdefault("report_to", "none")
    kwargs.setdefault("disable_tqdm", True)      # progress bars garble rank logs; the Trainer still logs losses
    return cls(**kwargs)
