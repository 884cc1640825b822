"""The records of notebook 02's DeepSpeed training loop (scripts/02_train.py)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class TrainLoss(Record, name="train_loss"):
    """The training loss at a step, averaged over the ranks."""
    step: int
    loss: float

