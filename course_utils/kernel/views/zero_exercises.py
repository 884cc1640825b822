"""Notebook 03's exercise checks that judge the learner's function itself, here in the kernel, on what the page does
not show: DeepSpeed's own partitioning code for other numbers of ranks (exercise 1), a stage-3 model on a world of one
rank built in the kernel (exercise 2), and the adjusted formula of section 3 for machines the notebook never launches
(exercise 3). Each returns what is wrong ('' when nothing is), never the expected values; the launches' measurements
are checked beside them in the notebook.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
from types import SimpleNamespace
from typing import Any, Callable, Sequence
from unittest import mock

WHOLE_READ_NAMES = ("transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.ln_1.weight")


def shard_mismatches(predict_stage3: Callable, shapes: Sequence[tuple], world_sizes: Sequence[int] = (2, 3, 5, 8)) -> str:
    """Where ``predict_stage3(shape, n)["shard"]`` differs from the shard DeepSpeed's own code cuts for a parameter of
    that shape on ``n`` ranks (``Init._aligned_size`` pads the parameter to a multiple of ``n``, ``_partition_param``
    gives each rank ``tensor_size // n``; run here on a stand-in for a ``zero.Init`` of ``n`` ranks), or its
    ``"inside"`` from what a gather gives back (``param.data = ….narrow(0, 0, param.ds_numel).view(param.ds_shape)``
    in ``partition_parameters.py``: the whole weight, its padding cut off): '' when nowhere, else how many (shape,
    ranks) pairs differ and the first of them."""
    from deepspeed.runtime.zero.partition_parameters import Init

    class Ranks:            # what Init's size arithmetic asks of a zero.Init: the number of ranks a parameter is cut into
        _padding_size = Init._padding_size
        _aligned_size = Init._aligned_size

        def __init__(self, n: int):
            self.n = n

        def _partition_world_size(self, param: Any) -> int:
            return self.n

    wrong = []
    for n in world_sizes:
        for shape in dict.fromkeys(tuple(s) for s in shapes):
            numel = 1
            for d in shape:
                numel *= d
            deepspeed_cuts = Ranks(n)._aligned_size(SimpleNamespace(ds_numel=numel)) // n
            answer = predict_stage3(shape, n)
            if answer.get("shard") != deepspeed_cuts:
                wrong.append((shape, n, "shard", "the shard DeepSpeed cuts"))
            elif answer.get("inside") != numel:
                wrong.append((shape, n, "inside", "what DeepSpeed's gather gives back"))
    if not wrong:
        return ""
    shape, n, key, theirs = wrong[0]
    return (f"your \"{key}\" differs from {theirs} for {len(wrong)} of {len(world_sizes) * len(set(map(tuple, shapes)))} "
            f"(shape, ranks) pairs, the first a weight of shape {shape} on {n} ranks.")


@contextlib.contextmanager
def _one_rank_world() -> Any:
    """A process group of one rank in this kernel (an in-memory store, no port; the backend DeepSpeed's accelerator
    names: gloo on a CPU, nccl on a GPU) for DeepSpeed code that needs one, DeepSpeed's handle on it, and its start-up
    chatter kept out of the notebook; all gone afterwards (with the "[rank0]" prefix torch puts on the interpreter's
    exception hook, and the functions of torch that ``zero.Init(module=...)`` replaces for good, such as ``F.linear``:
    DeepSpeed's own would turn every later linear layer of the kernel into its autograd function)."""
    import sys

    import torch
    import torch.nn.functional as F

    import deepspeed.comm.comm as ds_comm
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import logger

    if dist.is_initialized():
        raise RuntimeError("this kernel already has a process group; restart the kernel to run this check")
    level, hook = logger.level, sys.excepthook
    kept = {module: dict(vars(module)) for module in (torch, F)}
    with mock.patch.dict(os.environ, {"LOCAL_RANK": "0"}):
        backend = get_accelerator().communication_backend_name()
        dist.init_process_group("gloo" if backend == "ccl" else backend, store=dist.HashStore(), rank=0, world_size=1)
        try:
            logger.setLevel(logging.WARNING)
            yield
        finally:
            logger.setLevel(level)
            dist.destroy_process_group()
            ds_comm.cdb = None
            sys.excepthook = hook
            for module, attributes in kept.items():
                for name, value in attributes.items():
                    if vars(module).get(name) is not value:
                        setattr(module, name, value)


def whole_read_problems(read_whole: Callable, rel: float = 1e-5) -> list[str]:
    """What ``read_whole`` gets wrong on a stage-3 model built here in the kernel, on a world of one rank: the course's
    smallest GPT-2 (``tiny_gpt2("checkpoints")``) partitioned by ``deepspeed.zero.Init(module=...)``, so that every
    parameter's ``.data`` is an empty placeholder outside a gather, as on the ranks. Its answer for the three parameters
    the launch reads is held against their shapes and norms taken before the partitioning."""
    import deepspeed

    from course_utils.rank.models import tiny_gpt2

    model = tiny_gpt2("checkpoints")
    params = {name: p for name, p in model.named_parameters() if name in WHOLE_READ_NAMES}
    whole = {name: (tuple(p.shape), float(p.detach().norm())) for name, p in params.items()}
    with _one_rank_world():
        with contextlib.redirect_stdout(io.StringIO()):      # "DeepSpeed ... shm_comm_op built successfully"
            deepspeed.zero.Init(module=model, config_dict_or_path={"train_micro_batch_size_per_gpu": 1,
                                                                   "zero_optimization": {"stage": 3}})
        try:
            got = read_whole(dict(params))
        except Exception as e:      # the learner's code failed: that is the verdict
            return [f"read_whole raised {type(e).__name__}: {e}"]
    if not isinstance(got, dict):
        return [f"read_whole returned a {type(got).__name__}, not a dict"]
    wrong = []
    for name, (shape, norm) in whole.items():
        answer = got.get(name)
        if not (isinstance(answer, (list, tuple)) and len(answer) == 2):
            wrong.append(f"{name}: not a (shape, norm) pair")
        elif tuple(answer[0]) != shape:
            wrong.append(f"{name}: shape")
        elif not isinstance(answer[1], (int, float)) or abs(answer[1] - norm) > rel * norm:
            wrong.append(f"{name}: norm")
    return wrong


def budget_problems(budget_plan: Callable, base: dict, psi: int, stage0_bytes: float, persistent_numel: int,
                    param_numels: Sequence[int], budget: float = 0.36, ranks: Sequence[int] = (8, 16),
                    tolerance: float = 0.03) -> str:
    """What ``budget_plan`` gets wrong on ``ranks`` the notebook never launches, held against rank 0's bytes by the
    adjusted formula of section 3 (:func:`~course_utils.common.zero_rules.deepspeed_expected`, with rank 0's gradient
    buffer of stages 1–2 from ``param_numels``, :func:`~course_utils.common.zero_rules.edge_grad_numel`: the formula the
    notebook checks against every rank's measured bytes): the config DeepSpeed reads for that many ranks must train in
    fp32 at the lowest stage whose model states fit ``budget`` × stage 0's, and the predicted bytes must be within
    ``tolerance`` of that stage's. '' when nothing is wrong."""
    from course_utils.common.zero_rules import deepspeed_expected, edge_grad_numel
    from course_utils.kernel import configs

    edges = {n: edge_grad_numel(param_numels, n, 0) for n in ranks}      # rank 0's gradient buffer, stages 1–2

    def held(stage: int, n: int) -> float:
        return deepspeed_expected(psi, stage, n, "fp32", grad_partition_numel=edges[n],
                                  persistent_numel=persistent_numel if stage == 3 else 0)["total"]

    for n in ranks:
        config, predicted = budget_plan(base, psi, n)
        parsed, refused = configs.deepspeed_verdict(config, n)
        if refused:
            return f"on {n} ranks DeepSpeed refuses your config: {refused}."
        if parsed.float16_config.enabled or parsed.bfloat16_config.enabled:
            return f"on {n} ranks your config trains in 16 bits; the team trains in fp32."
        stage = parsed.zero_optimization_stage
        lowest = next(s for s in range(4) if held(s, n) <= budget * stage0_bytes)
        if stage < lowest:
            return f"on {n} ranks your stage {stage} holds more than the budget."
        if stage > lowest:
            return f"on {n} ranks a lower stage than your {stage} fits the budget."
        if not isinstance(predicted, (int, float)) or abs(predicted / held(stage, n) - 1) > tolerance:
            return (f"on {n} ranks your prediction is more than {tolerance:.0%} off what DeepSpeed holds at stage {stage} "
                    f"(the adjusted formula that section 3 checked against the measured bytes).")
    return ""
