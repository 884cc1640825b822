"""The records of notebook 06's mixed precision launch (scripts/06_mixed_precision.py): an engine's dtypes and
the bytes of its gradient all-reduce, loss-scaling runs, the hysteresis demo, the LR scheduler on skipped steps."""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import Record

# An all_reduce message of at least this many bytes is a gradient bucket; the smaller ones in a ZeRO-1/2 step
# are the overflow flag (1 byte, has_overflow) and the squared gradient norm (one fp32 number, get_grad_norm_direct).
GRAD_MESSAGE_MIN_BYTES = 256


@dataclass
class EngineError(Record, name="engine_error"):
    """A precision that ``deepspeed.initialize`` refused on this machine."""
    precision: str
    error: str


@dataclass
class EngineDtypes(Record, name="engine_dtypes"):
    """The dtypes one precision's engine holds (:func:`course_utils.rank.engine.engine_dtypes`) and what
    its collectives moved in one training step (DeepSpeed's comms logger, :mod:`course_utils.rank.comms`)."""
    precision: str
    module: str | None
    master: str | None
    grad: str | None
    forward: str                    # dtype of the model's output (the forward pass's compute dtype)
    loss_scale: float
    psi: int                        # parameters of the model (Ψ)
    messages: dict                  # op → {message bytes → count} logged during that step
    grad_allreduce_bytes: int       # sum of the step's all_reduce messages of ≥ GRAD_MESSAGE_MIN_BYTES
    communication: str | None = None   # engine.communication_data_type, as the engine reports it


@dataclass
class Trace(Record, name="trace"):
    """One loss-scaling run, step by step."""
    label: str
    scale: list = field(default_factory=list)       # the loss scale each step used
    overflow: list = field(default_factory=list)    # whether the step overflowed (and was skipped)
    lr: list = field(default_factory=list)          # the learning rate after the step
    loss: list = field(default_factory=list)       # rank 0's loss on its own batch of the step (noisy: the batch changes)
    held_out: list = field(default_factory=list)   # after the step, the loss on a fixed batch no step trains on
    dtypes: dict = field(default_factory=dict)      # module / master / grad dtypes at the end
    engine_skipped_steps: int | None = None         # the fp16 engine's own count (GPU only)


@dataclass
class HysteresisDemo(Record, name="hysteresis_demo"):
    """DeepSpeed's DynamicLossScaler fed one overflow pattern, with consecutive_hysteresis false and true."""
    overflow: list
    hysteresis: int
    scale: dict = field(default_factory=dict)       # "false" / "true" → the scale before each step


@dataclass
class EngineLr(Record, name="engine_lr"):
    """An engine with the config's WarmupLR whose gradients were made inf on chosen steps, read after each step."""
    precision: str
    inf_rank: int                                   # the rank whose loss was multiplied by inf
    inf_steps: list
    lr_start: float                                 # engine.get_lr() before the first step
    overflow: list = field(default_factory=list)    # engine.optimizer.overflow
    skipped_steps: list = field(default_factory=list)         # engine.skipped_steps
    scheduler_iteration: list = field(default_factory=list)   # engine.lr_scheduler.last_batch_iteration
    lr: list = field(default_factory=list)          # engine.get_lr()[0]

