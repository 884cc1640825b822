"""Notebook 04's exercise checks that judge the learner's function itself, here in the kernel, on what the page does
not show: the NVMe config for a folder the notebook never uses, read by DeepSpeed's own config classes (exercise 1),
and the persistence keys for GPT-2 shapes the notebook does not train on this machine, run through DeepSpeed's own
``mark_persistent_parameters`` on models built on the meta device (exercise 2). Each returns what is wrong ('' when
nothing is), never the expected keys or values; the launch's measurements are checked beside them in the notebook.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Callable
from unittest import mock

ELSEWHERE = "/mnt/nvme0/deepspeed-swap"        # a folder the notebook never uses: the answer must take the one it is given
OFFLOADS = ("offload_optimizer", "offload_param")
OTHER_SHAPES = ("gpt2", "gpt2-medium")         # GPU sizes of the course's GPT-2 (course_utils.rank.models.GPU_SIZES)


def nvme_problems(with_nvme: Callable, stage3: dict, world_size: int = 2) -> str:
    """What ``with_nvme(stage3, ELSEWHERE)`` gets wrong: it must leave ``stage3`` as it was, and DeepSpeed's own config
    classes must read from its answer both offloads on NVMe under that folder, in ZeRO stage 3, with every other key of
    ``stage3`` kept as it was."""
    from course_utils.kernel import configs

    given = copy.deepcopy(stage3)
    answer = with_nvme(given, ELSEWHERE)
    if given != stage3:
        return "your function changed the config it was given: return a changed copy, the original must stay as it was."
    if not isinstance(answer, dict) or not isinstance(answer.get("zero_optimization"), dict):
        return "your function must return the whole config, a dict with its zero_optimization section."
    lost = [k for k in stage3 if k != "zero_optimization" and answer.get(k) != stage3[k]] + \
        [f"zero_optimization.{k}" for k in stage3["zero_optimization"]
         if k not in OFFLOADS + ("stage",) and answer["zero_optimization"].get(k) != stage3["zero_optimization"][k]]
    if lost:
        named = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more keys" if len(lost) > 3 else "")
        return (f"your config no longer holds the given config's {named} as it was: add the offload keys to a copy of "
                "the config, and keep everything else it says.")
    parsed, refused = configs.deepspeed_verdict(answer, world_size)
    if refused:
        return f"DeepSpeed refuses the config your function returned: {refused}."
    zero = parsed.zero_config
    if zero.stage != 3:
        return (f"DeepSpeed reads your config as ZeRO stage {int(zero.stage)}: offload_param acts only in stage 3; "
                "stages 1 and 2 keep the optimizer states in CPU memory even when offload_optimizer names nvme "
                "(stage_1_and_2.py), and stage 0 offloads nothing. Keep the config's stage.")
    for section in OFFLOADS:
        offload = getattr(zero, section)
        if offload is None:
            return f"DeepSpeed finds no zero_optimization.{section} in your config: that state writes no swap file."
        if offload.device != "nvme":
            device = str(getattr(offload.device, "value", offload.device))
            return f"DeepSpeed reads zero_optimization.{section} as device {device!r}: that state writes no swap file."
        if offload.nvme_path is None or Path(offload.nvme_path) != Path(ELSEWHERE):
            return (f"asked for the folder {ELSEWHERE}, your config sends zero_optimization.{section}'s files "
                    f"elsewhere: use the folder your function is given.")
    return ""


@functools.lru_cache(maxsize=None)
def _meta_gpt2(size: str):
    import torch

    from course_utils.rank.models import tiny_gpt2

    with torch.device("meta"):
        return tiny_gpt2("zero_lab", size=size)


def persistence_problems(all_but_embedding: Callable, model: Any, other_sizes: tuple = OTHER_SHAPES) -> str:
    """What ``all_but_embedding(m)`` gets wrong for ``model`` and the GPT-2s of ``other_sizes`` (built on the meta
    device): its keys, merged into ``configs/zero3.json``'s ``zero_optimization`` and read by DeepSpeed's own config
    classes, must make DeepSpeed's ``DeepSpeedZeRoOffload.mark_persistent_parameters`` (run here on the model) keep
    every parameter whole but the token embedding."""
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

    from course_utils.kernel import configs

    stage3 = configs.load("zero3.json")[0]
    mine = copy.deepcopy(model)             # DeepSpeed marks the parameters it reads: not the notebook's own model
    for name, m in [("the course model", mine)] + [(f"GPT-2 of size {s}", _meta_gpt2(s)) for s in other_sizes]:
        keys = all_but_embedding(m)
        if not isinstance(keys, dict):
            return f"for {name} your function returned a {type(keys).__name__}, not a dict of zero_optimization keys."
        parsed, refused = configs.deepspeed_verdict({**stage3, "zero_optimization": {**stage3["zero_optimization"], **keys}})
        if refused:
            return f"for {name} DeepSpeed refuses your keys: {refused}."
        for p in m.parameters():
            p.ds_numel = p.numel()          # what mark_persistent_parameters reads of a stage-3 parameter
        zero = parsed.zero_config
        with mock.patch("deepspeed.runtime.zero.parameter_offload.print_rank_0"):     # it asks a process group for the rank
            persistent = DeepSpeedZeRoOffload.mark_persistent_parameters(
                type("Offload", (), {"module": m})(), zero.param_persistence_threshold, zero.model_persistence_threshold)
        embedding = m.get_input_embeddings().weight
        if any(p is embedding for p in persistent):
            return f"for {name} the embedding is whole on every rank too."
        partitioned = sum(1 for p in m.parameters() if p is not embedding and not any(p is q for q in persistent))
        if partitioned:
            return f"for {name} {partitioned} parameters other than the embedding are still partitioned."
    return ""
