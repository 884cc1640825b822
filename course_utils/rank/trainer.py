"""The Hugging Face Trainer on DeepSpeed ranks, on GPUs and on CPU-only machines alike; the HF × DS
optimizer/scheduler combinations (notebook 07) and a record of what "auto" was filled with (notebook 08).

On GPUs, ``TrainingArguments(deepspeed=...)`` sets up the distributed state by itself. On a CPU-only
machine it does not: accelerate's ``PartialState`` picks a backend only for an accelerator it knows (or
when asked for CPU), finds none, and then counts one process, so
every rank believes it is alone (world size 1) and DeepSpeed's batch-size check fails
(train_batch_size != micro_batch × grad_acc × world_size). The remedy, applied by
:func:`training_arguments`, is to build accelerate's ``PartialState`` for DeepSpeed over gloo
*first*, and tell the Trainer to use it (``accelerator_config={"use_configured_state": True}``).
"""
from __future__ import annotations

import contextlib
import copy
import os
from functools import partialmethod
from typing import Any, Iterator


from course_utils.common import devices
from course_utils.common.records.trainer import AutoFill


def prepare_cpu_state() -> None:
    """Join the launched ranks' process group (gloo) as accelerate's DeepSpeed state, in CPU ranks only
    (:func:`course_utils.common.devices.is_cpu_rank`: on a GPU machine a CPU rank may still see the GPU)."""
    if not devices.is_cpu_rank():
        return
    from accelerate import PartialState

    previous = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"     # what TrainingArguments sets for DeepSpeed, on any device
    try:
        PartialState(backend="gloo")
    finally:
        if previous is None:
            os.environ.pop("ACCELERATE_USE_DEEPSPEED")
        else:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = previous


def with_configured_state(accelerator_config: Any) -> Any:
    """``accelerator_config`` (None, a dict or an ``AcceleratorConfig``) telling the Trainer to use the state
    :func:`prepare_cpu_state` built (``use_configured_state``); a dict comes back as a new dict, a JSON path unchanged."""
    if accelerator_config is None or isinstance(accelerator_config, dict):
        return {**(accelerator_config or {}), "use_configured_state": True}
    if hasattr(accelerator_config, "use_configured_state"):
        accelerator_config.use_configured_state = True
    return accelerator_config


def training_arguments(cls: type | None = None, **kwargs: Any):
    """``TrainingArguments`` (or ``cls``, e.g. Seq2SeqTrainingArguments) that work on GPU and CPU ranks."""
    from transformers import TrainingArguments

    cls = cls or TrainingArguments
    if devices.is_cpu_rank():
        prepare_cpu_state()
        kwargs["accelerator_config"] = with_configured_state(kwargs.pop("accelerator_config", None))
    kwargs.setdefault("report_to", "none")
    kwargs.setdefault("disable_tqdm", True)      # progress bars garble rank logs; the Trainer still logs losses
    return cls(**kwargs)


# ---- notebook 07: the HF/DS optimizer × scheduler matrix ------------------------------------------

# Beyond the matrix: HF optimizer + HF scheduler + ZeRO-Offload with one thing changed, to show what accelerate's
# map_pytorch_optim_to_deepspeed replaces (any torch optimizer → a DeepSpeed CPU optimizer) and when it does not.
# name → (extra TrainingArguments, extra top-level DeepSpeed config)
OFFLOAD_VARIANTS: dict[str, tuple[dict, dict]] = {
    "optim=sgd": ({"optim": "sgd"}, {}),
    "zero_force_ds_cpu_optimizer=false": ({}, {"zero_force_ds_cpu_optimizer": False}),
}


def combo_key(hf_opt: bool, hf_sched: bool, offload: bool, variant: str | None = None) -> str:
    """``"hf_opt+ds_sched"``, with ``"+offload"`` appended for ZeRO-Offload runs and ``" [variant]"`` for an
    entry of :data:`OFFLOAD_VARIANTS`."""
    key = f"{'hf' if hf_opt else 'ds'}_opt+{'hf' if hf_sched else 'ds'}_sched"
    return key + ("+offload" if offload else "") + (f" [{variant}]" if variant else "")


def matrix_cell(key: str) -> str:
    """The cell of the documented HF/DS table a combination belongs to: ``"hf_opt+ds_sched"``."""
    return "+".join(key.split(" [")[0].split("+")[:2])


def combos(offload_options: tuple[bool, ...] = (False, True)) -> list[tuple[bool, bool, bool]]:
    """Every (hf_opt, hf_sched, offload) combination, in the order of the documented table."""
    return [(o, s, off) for off in offload_options for o in (True, False) for s in (True, False)]


def combo_config(base: dict, hf_opt: bool, hf_sched: bool, offload: bool) -> dict:
    """``base`` with its ``optimizer``/``scheduler`` sections removed where Hugging Face provides them,
    and the optimizer offloaded to the CPU or not. A section absent from the DeepSpeed config is what
    tells the Trainer to build that piece itself."""
    cfg = copy.deepcopy(base)
    if hf_opt:
        cfg.pop("optimizer", None)
    if hf_sched:
        cfg.pop("scheduler", None)
    zero = cfg.setdefault("zero_optimization", {"stage": 2})
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    else:
        zero.pop("offload_optimizer", None)
    return cfg


# ---- notebook 08: "auto", what the Trainer filled in and from which argument ---------------------

@contextlib.contextmanager
def recording_auto_fills() -> Iterator[list[AutoFill]]:
    """Record every ``fill_match``/``fill_only`` call of ``HfTrainerDeepSpeedConfig`` that replaces an
    "auto" value (an :class:`AutoFill`). The wrapper calls the original method, so behaviour is unchanged."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig as Cfg

    filled: list[AutoFill] = []
    original = Cfg.fill_match

    def fill_match(self, ds_key_long, hf_val, hf_key=None, must_match=True):
        was_auto = self.is_auto(ds_key_long)
        original(self, ds_key_long, hf_val, hf_key, must_match)
        if was_auto:
            filled.append(AutoFill(key=ds_key_long, value=hf_val, source=hf_key or "(set by the Trainer)"))

    Cfg.fill_match = fill_match
    Cfg.fill_only = partialmethod(fill_match, must_match=False)
    try:
        yield filled
    finally:
        Cfg.fill_match = original
        Cfg.fill_only = partialmethod(original, must_match=False)
