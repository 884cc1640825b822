"""Notebook 09's records: the checkpoint layout ``scripts/09_checkpoints.py`` saves."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class Saved(Record, name="saved"):
    """One checkpoint of the layout launch: its precision, ZeRO stage, the class of ``engine.optimizer``
    (whose state the checkpoint holds) and the dtype of the module's parameters."""
    dtype: str
    stage: int
    optimizer: str
    param_dtype: str
