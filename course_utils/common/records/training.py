"""The records of notebook 02's DeepSpeed training loop (scripts/02_train.py)."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class TrainLoss(Record, name="train_loss"):
    """One training step on one rank: the loss of this rank's own batch (measured by the script from the step's
    logits), the mean over ranks that the step function returned for logging, and the value of the loss it handed to
    ``engine.backward`` (None unless it called backward exactly once that step)."""
    step: int
    own: float
    mean: float
    backward: float | None = None

