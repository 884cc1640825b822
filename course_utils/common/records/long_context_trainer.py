"""Notebook 17's Trainer launch (``scripts/17_trainer_sp.py``): what each rank records of the Hugging Face Trainer
training the course's tiny Llama with Ulysses sequence parallelism, named once for the ranks and the notebook."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import Record


@dataclass
class TrainerSpRun(Record, name="lc_trainer_run"):
    """One rank of the Trainer launch."""
    parallelism: dict        # the ParallelismConfig sizes the Trainer ran with (sp_size, dp_replicate_size, …)
    train_batch_size: int    # the DeepSpeed engine's train_batch_size (accelerate sets it from the data-parallel sizes)
    losses: list             # per step: the loss the Trainer logged (log_history)
    grad_norms: list         # per step: the gradient norm the Trainer logged (DeepSpeed's global norm)
    samples: list            # per forward pass of this rank: the sample its slice of the sequence came from
