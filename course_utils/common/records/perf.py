"""Notebook 11's records: performance (``scripts/11_performance.py``) and the hang drill (``scripts/11_hang.py``), and
the accumulation config both the script and the notebook build."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from course_utils.common.record import Record

SGD_LR = 0.5          # plain SGD: an update proportional to the gradient, so a wrongly scaled loss shows at once


@dataclass
class Trajectory(Record, name="trajectory"):
    """One accumulation setting: the loss of every optimizer step's samples at the weights before it (over every token
    they label, averaged over the ranks)."""
    micro: int
    gas: int
    train_batch_size: int            # what the engine computed: micro × gas × world size
    loop: str                        # "yours" (exercise 1) or "course"
    loss: list = field(default_factory=list)
    weight_sum: float = 0.0          # Σ of all weights at the end (float64): the same updates, the same sum
    returned: str = ""               # "" when the loop returned a list of one float per micro-batch, else what it did


@dataclass
class MicroStep(Record, name="micro_step"):
    """One micro-step of 2 × 4, read from the engine."""
    micro_step: int
    boundary: bool                   # engine.is_gradient_accumulation_boundary() before backward
    returned_over_loss: float        # what engine.backward(loss) returned, divided by the loss
    weights_changed: bool            # by this micro-step's engine.step()
    global_steps: int                # engine.global_steps after it


@dataclass
class LoopUpdate(Record, name="loop_update"):
    """One hand-written accumulation loop, run from the course's initial weights over the first micro-batches of 2 × 4,
    and the update it made, set against updates computed by hand with plain torch: ``fits`` maps each by-hand update's
    name to [factor, left over] of the least-squares fit update ≈ factor × it (left over relative to its size)."""
    loop: str
    micro_batches: int               # how many micro-batches it ran
    changed_after: list              # the micro-batches (counted from 1) whose call changed the weights
    global_steps: int                # engine.global_steps at the end
    optimizer: str                   # the class of the optimizer deepspeed.initialize returned
    fits: dict
    error: str = ""                  # the traceback, where the loop raised


@dataclass
class Activation(Record, name="activation"):
    """One forward + backward pass under torch's MemTracker (bytes by category)."""
    checkpointing: str               # off | hf | deepspeed
    seq_len: int
    batch: int
    after_forward: int               # activation bytes alive when the forward pass ended (kept for backward)
    peak_total: int                  # all tracked bytes at the peak of the pass
    peak: dict                       # the categories at that peak


@dataclass
class Recompute(Record, name="recompute"):
    """Forward + backward passes (no tracker) per checkpointing setting, interleaved over ``repeats`` rounds
    (:func:`perf.interleaved_passes`): the median seconds, and every pass's forward, backward and page faults."""
    seq_len: int
    batch: int
    seconds: dict                    # setting → median seconds of a whole pass
    passes: dict = field(default_factory=dict)   # setting → {"forward": [s], "backward": [s], "minor_faults": [n]}


@dataclass
class ModelStates(Record, name="model_states"):
    """Bytes of this rank's model states in the profiled engine (tensor accounting)."""
    stage: int
    world_size: int
    bytes: dict                      # params / grads / optimizer


@dataclass
class StepTime(Record, name="step_time"):
    """One training step of the profiled engine."""
    step: int
    wall_ms: float                   # forward + backward + step, by the clock around them
    timers: dict                     # engine.get_wall_clock_timers(): ms per timer (wall_clock_breakdown)
    comm: dict                       # op → [[message bytes, [logged ms, ...]]] from DeepSpeed's comms logger
    loss: float


@dataclass
class FlopsProfile(Record, name="flops_profile"):
    """DeepSpeed's flops profiler at its profile step (rank 0), and this rank's matmul peak."""
    profile_step: int
    micro_batch: int
    seq_len: int
    fwd_flops: int                   # the profiler's total for one forward pass of one micro-batch
    params: int
    modules: list                    # per top-level module: fwd_flops, params, latency_s
    peak_flops_per_s: float          # perf.matmul_flops_per_s on this rank
    output_file: str


@dataclass
class Logged(Record, name="logged"):
    """One step of one rank: the loss it had and the value its log_metrics returned."""
    step: int
    loss: float
    logged: float


@dataclass
class DebugEnv(Record, name="debug_env"):
    """The debugging variables this rank found in its environment (absent ones left out), and its backend."""
    variables: dict
    backend: str


def accumulation_config(base: dict, micro: int, gas: int) -> dict:
    """The base config with this micro-batch × accumulation, plain SGD without gradient clipping (DeepSpeed clips at a
    norm of 1.0 unless told otherwise: an update is then the gradient times the learning rate), and no profiling or
    monitoring."""
    cfg = {k: v for k, v in copy.deepcopy(base).items()
           if k not in ("flops_profiler", "csv_monitor", "wall_clock_breakdown", "activation_checkpointing")}
    cfg.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas,
               optimizer={"type": "SGD", "params": {"lr": SGD_LR}}, gradient_clipping=0.0,
               zero_allow_untested_optimizer=True)     # ZeRO accepts a torch optimizer it was not tested with
    cfg.pop("train_batch_size", None)
    return cfg
