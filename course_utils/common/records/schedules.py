"""Notebook 07's records: DeepSpeed's optimizers and schedulers built from a config
(``scripts/07_optimizers_and_schedulers.py``), and the Trainer's optimizer/scheduler matrix
(``scripts/07_trainer_matrix.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class OptimizerOutcome(Record, name="optimizer"):
    """One optimizer section: what deepspeed.initialize built from it (or the error it raised)."""
    label: str
    outcome: str                          # "ok" or the error's class name
    error: str | None = None
    optimizer_class: str | None = None    # module.Class of the optimizer doing the step
    adam_w_mode: bool | None = None
    wrapper: str | None = None            # the engine's optimizer around it (ZeRO, fp16, ...)
    losses: list | None = None           # each step's loss, each on that step's own batch
    held_out: list | None = None         # [before, after] training: the loss on one batch never trained on


@dataclass
class LrCurve(Record, name="lr_curve"):
    """The learning rate (and Adam's betas) the engine used at each step under one scheduler section."""
    label: str
    scheduler: str
    lr: list
    betas: list                           # [beta1, beta2] per step, read like lr (engine.get_mom())


@dataclass
class Combo(Record, name="combo"):
    """One cell of the matrix: a Trainer run with this combination, and what happened."""
    key: str                              # combo_key: "hf_opt+ds_sched", "+offload" appended for ZeRO-Offload
    outcome: str                          # "ok" or the error's class name
    variant: str | None = None            # an entry of OFFLOAD_VARIANTS, or None for the matrix itself
    optimizer_class: str | None = None    # the optimizer that steps (inside the ZeRO optimizer)
    adam_w_mode: bool | None = None       # DeepSpeed's Adam classes: decoupled weight decay or not
    scheduler_class: str | None = None
    train_loss: float | None = None       # the Trainer's training_loss: the mean of the steps' losses
    losses: list | None = None            # each step's loss, as the Trainer logged it (logging_steps=1)
    world_size: int | None = None
    error: str | None = None
