"""Notebook 17 in the kernel, the Trainer route: the launch of ``scripts/17_trainer_sp.py`` (the Hugging Face Trainer
with accelerate's ``ParallelismConfig``), and exercise 4's check of the learner's ``trainer_parallelism``.

The check judges the learner's keyword arguments on models and world sizes the page never shows, with the libraries'
own code run here in the kernel, where no process group exists:

- accelerate: ``ParallelismConfig(**kwargs)`` (its ``__post_init__``) and ``ParallelismConfig._validate_accelerator``,
  given what an ``Accelerator`` of a DeepSpeed launch reports (the only attributes that method reads);
- DeepSpeed: ``parallel_state_sp.initialize_sequence_parallel`` (the groups accelerate asks for through
  ``register_with_transformers``) and ``UlyssesSPAttentionHF.__init__`` (the head rules), with the module's ``dist``
  answering for the world size asked about; and ``DeepSpeedConfig``'s batch check on the ``train_batch_size``
  accelerate writes when SP is on (``Accelerator._prepare_deepspeed``: micro-batch × accumulation ×
  ``ParallelismConfig.data_parallel_size``, against DeepSpeed's world size ÷ SP size).

Each refusal says which rule refused the learner's own answer, never the expected size.
"""
from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable
from unittest import mock

from course_utils.common.record import read_as
from course_utils.common.records.long_context_trainer import TrainerSpRun
from course_utils.kernel.launch.options import launches

PROCS = 2        # the page's world: the tiny Llama's 4 query and 2 key/value heads split over 2 SP ranks

# (what the case is, query heads, key/value heads, ranks): the check asks the learner's function about these only
CASES = (
    ("Llama-3-8B's heads (32 query, 8 key/value) on 16 ranks", 32, 8, 16),
    ("Qwen2.5-7B's heads (28 query, 4 key/value) on 8 ranks", 28, 4, 8),
    ("Phi-3-medium's heads (40 query, 10 key/value) on 8 ranks", 40, 10, 8),
    ("Qwen2.5-0.5B's heads (14 query, 2 key/value) on 8 ranks", 14, 2, 8),
    ("Falcon-7B's heads (71 query, 1 key/value) on 8 ranks", 71, 1, 8),
    ("a model with 12 query and 3 key/value heads on 4 ranks", 12, 3, 4),
    ("a model with 6 query and 2 key/value heads on 4 ranks", 6, 2, 4),
)


# ---------------------------------------------------------------- the launch

@dataclass
class TrainerLaunch:
    """What every rank of one Trainer launch recorded, and the launch's seconds."""
    runs: list[TrainerSpRun]
    seconds: float

    @property
    def losses(self) -> list[float]:
        """The losses the Trainer logged, one per step (every rank logs the same: the loss is the SP group's)."""
        return self.runs[0].losses


@launches(procs=PROCS, min_ranks=PROCS)
def train(parallelism: dict | None = None, seq_len: int = 512, steps: int = 4, quiet: bool = True) -> TrainerLaunch:
    """Launch ``scripts/17_trainer_sp.py``: the Trainer trains the tiny Llama for ``steps`` steps of one sample of
    ``seq_len`` tokens with ``ParallelismConfig(**parallelism)`` (the learner's keyword arguments, passed as JSON;
    by default SP over the launch's 2 ranks)."""
    from course_utils.kernel import launch

    sizes = ["--parallelism", json.dumps(parallelism)] if parallelism is not None else ["--sp_size", str(PROCS)]
    result = launch.deepspeed("17_trainer_sp.py", "--seq_len", seq_len, "--steps", steps, *sizes,
                              procs=PROCS, min_ranks=PROCS, quiet=quiet)
    return TrainerLaunch(read_as(result.records, TrainerSpRun, rank=None), result.seconds)


# ---------------------------------------------------------------- exercise 4: the learner's ParallelismConfig

def judge_parallelism(trainer_parallelism: Callable[[int, int, int], dict]) -> list[str]:
    """What is wrong with ``trainer_parallelism(heads, kv_heads, world_size)`` on :data:`CASES`: at most one problem
    per case, [] when none. The learner's ``NotImplementedError`` passes through (the notebook's check turns it into
    "not done yet")."""
    problems = []
    for label, heads, kv_heads, world in CASES:
        try:
            kwargs = trainer_parallelism(heads, kv_heads, world)
        except NotImplementedError:
            raise
        except Exception as error:                    # noqa: BLE001 - the learner's code: say what it raised
            problems.append(f"for {label}, your function raised {type(error).__name__}: {error}")
            continue
        problem = _problem(kwargs, heads, kv_heads, world)
        if problem:
            problems.append(f"for {label}: {problem}")
    return problems


def _problem(kwargs, heads: int, kv_heads: int, world: int) -> str:
    """The first rule the keyword arguments break for this model on ``world`` ranks, '' when none does."""
    if not isinstance(kwargs, dict):
        return f"your function returned a {type(kwargs).__name__}, not a dict of ParallelismConfig keyword arguments."
    try:
        json.dumps(kwargs)
    except TypeError:
        return ("return sizes and names only (numbers and strings): the launch hands your keyword arguments to the "
                "ranks as JSON, and the script adds the sp_handler itself.")
    config, refused = _accelerate_verdict(kwargs, world)
    if refused:
        return refused
    sp = config.sp_size
    if sp > 1:
        refused = _ulysses_refusal(sp, heads, kv_heads, world) or _batch_refusal(config, world)
        if refused:
            return refused
    if any(not _ulysses_refusal(d, heads, kv_heads, world) for d in range(sp + 1, world + 1) if world % d == 0):
        return (f"DeepSpeed accepts your sp_size={sp}, and it also accepts a larger SP size that divides the "
                f"{world} ranks: each rank could hold a shorter slice of the sequence. Check which head rule "
                "really limits this model.")
    return ""


def _accelerate_verdict(kwargs: dict, world: int):
    """(ParallelismConfig, '') when accelerate accepts the keyword arguments for a DeepSpeed launch of ``world``
    processes, else (None, its words)."""
    from accelerate import ParallelismConfig
    from accelerate.utils import DistributedType

    try:
        config = ParallelismConfig(**kwargs)
    except Exception as error:                        # noqa: BLE001 - accelerate's own words
        return None, f"accelerate's ParallelismConfig refuses your keyword arguments: {type(error).__name__}: {error}"
    # what Accelerator reports for a DeepSpeed launch of `world` processes (multi_device is False under DeepSpeed)
    accelerator = SimpleNamespace(num_processes=world, multi_device=False, is_fsdp2=False, is_main_process=False,
                                  distributed_type=DistributedType.DEEPSPEED)
    try:
        config._validate_accelerator(accelerator)
    except Exception as error:                        # noqa: BLE001
        return None, f"accelerate refuses your ParallelismConfig on {world} processes: {error}"
    return config, ""


def _ulysses_refusal(sp: int, heads: int, kv_heads: int, world: int) -> str:
    """DeepSpeed's refusal of SP size ``sp`` on ``world`` ranks for these head counts, '' when it accepts: the SP
    groups accelerate asks DeepSpeed for (``initialize_sequence_parallel``) and the attention module it registers on
    the model (``UlyssesSPAttentionHF.__init__``), each run with its module's ``dist`` answering for ``world`` ranks
    (the module-level group variables are restored after the call)."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as groups
    import deepspeed.runtime.sequence_parallel.ulysses_sp as ulysses

    world_dist = SimpleNamespace(is_initialized=lambda: True, get_world_size=lambda group=None: world,
                                 get_rank=lambda group=None: 0, new_group=lambda ranks: tuple(ranks))
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(groups, "dist", world_dist))
        stack.enter_context(mock.patch.object(groups, "_SEQUENCE_PARALLEL_GROUP", None))
        stack.enter_context(mock.patch.object(groups, "_SEQUENCE_DATA_PARALLEL_GROUP", None))
        try:
            groups.initialize_sequence_parallel(sequence_parallel_size=sp)
        except Exception as error:                    # noqa: BLE001 - DeepSpeed's own words
            return f"DeepSpeed cannot make sequence-parallel groups of your sp_size={sp}: {error}"
    sp_dist = SimpleNamespace(get_world_size=lambda group=None: sp, get_rank=lambda group=None: 0)
    with mock.patch.object(ulysses, "dist", sp_dist), mock.patch.object(ulysses, "register_all_to_all_group",
                                                                        lambda group: ""):
        try:
            ulysses.UlyssesSPAttentionHF(attn=None, batch_size=1, attn_head_count=heads, attn_head_size=64,
                                         kv_head_count=kv_heads, num_hidden_layers=1, process_group=None,
                                         seq_length_is_variable=True)
        except ValueError as error:
            return f"DeepSpeed's UlyssesSPAttentionHF refuses your sp_size={sp} for this model: {error}"
    return ""


def _batch_refusal(config, world: int) -> str:
    """DeepSpeed's batch check on the batch sizes accelerate writes with SP on (one sample per rank and step),
    '' when it passes."""
    from deepspeed.runtime.config import DeepSpeedConfig

    from course_utils.kernel.config_doctor import world_of

    batch = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
             "train_batch_size": config.data_parallel_size, "zero_optimization": {"stage": 3}}
    try:
        with world_of(world):
            DeepSpeedConfig(batch, mpu=SimpleNamespace(get_sequence_parallel_world_size=lambda: config.sp_size))
    except AssertionError as error:
        return (f"DeepSpeed's batch check refuses the train_batch_size accelerate writes for your sizes "
                f"(it takes dp_replicate_size × dp_shard_size as the data-parallel size): {error}")
    return ""
