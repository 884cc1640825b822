"""Notebook 08's records: the Hugging Face Trainer on DeepSpeed ranks (``scripts/08_trainer_integration.py``), the
"auto" values it filled in, and the command line and TrainingArguments every run of that script shares (the notebook
predicts with them)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from course_utils.common.record import Record


@dataclass
class EngineView(Record, name="engine_view"):
    """What the DeepSpeed engine inside the Trainer ended up with."""
    train_batch_size: int
    micro_batch: int
    gradient_accumulation_steps: int
    gradient_clipping: float
    world_size: int
    optimizer: str
    lr_scheduler: str


@dataclass
class Zero3Load(Record, name="zero3_load"):
    """A weight after ``from_pretrained`` under ZeRO-3, with or without a live HfDeepSpeedConfig."""
    label: str
    local_shape: list
    local_numel: int
    ds_numel: int | None          # set only when the weight was partitioned
    partition_numel: int | None


@dataclass
class AutoFill(Record, name="auto_fills"):
    """One "auto" value the Trainer replaced: the dotted config key, the value, and the TrainingArguments
    field it came from (or the quantity the Trainer computed)."""
    key: str
    value: Any
    source: str


@dataclass
class AutoOutside(Record, name="auto_outside"):
    """One try of part 5: the Trainer's config ("auto" in it) handed to DeepSpeed without the Trainer. ``numbers``:
    the keys given a number so far; ``error``: the exception's first line, ``where``: the frames in installed packages that
    raised it; else the engine's figures after ``losses`` steps (or the partitioned weight, for ``zero.Init``)."""
    label: str
    call: str
    numbers: list
    error: str | None = None
    where: list | None = None     # "package/file.py:function", outermost first
    train_batch_size: int | None = None
    reduce_bucket_size: int | None = None
    fp16: bool | None = None
    losses: list | None = None
    local_numel: int | None = None
    ds_numel: int | None = None


def trainer_settings(args: argparse.Namespace) -> dict:
    """The TrainingArguments every run of ``scripts/08_trainer_integration.py`` shares (the notebook predicts the
    "auto" values from them)."""
    return dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=args.steps,
                learning_rate=args.learning_rate, warmup_steps=1, weight_decay=0.01, max_grad_norm=1.0,
                logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The command line of ``scripts/08_trainer_integration.py`` (``description``: its help text)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=4, help="training steps of each Trainer run")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--parts", type=int, nargs="*", default=[1, 2, 3, 4, 5], help="which of the parts above to run")
    return parser
