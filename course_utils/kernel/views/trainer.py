"""Notebook 08's tables: each "auto" value of a Trainer config as written, as DeepSpeed received it and
the TrainingArguments field that filled it, and what else changed on the way; and the installed source lines of
transformers or accelerate that say so (notebooks 07 and 08)."""
from __future__ import annotations

from typing import Any

from course_utils.kernel.configs import auto_keys, leaf_paths
from course_utils.common.records.trainer import AutoFill, AutoOutside
from course_utils.kernel.views.source import show_source


def get_path(config: dict, dotted: str) -> Any:
    """``get_path(cfg, "optimizer.params.lr")``; None where a level is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def resolution_table(written: dict, received: dict, filled: list[AutoFill]) -> list[dict[str, Any]]:
    """One row per "auto" key: as written, as DeepSpeed received it, and the argument that filled it."""
    source = {f.key: f.source for f in filled}
    return [{"key": k, "written": get_path(written, k), "received by DeepSpeed": get_path(received, k),
             "filled from": source.get(k, "(not filled)")} for k in auto_keys(written)]


def other_changes(written: dict, received: dict) -> dict[str, tuple[Any, Any]]:
    """Values that changed on the way to DeepSpeed although they were not "auto": ``key → (written, received)``."""
    before, after = leaf_paths(written), leaf_paths(received)
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if before.get(k) != "auto" and before.get(k) != after.get(k)}



def print_outside(tries: list[AutoOutside]) -> None:
    """Part 5's tries in order, each as DeepSpeed answered it: the keys given numbers since the previous try, then the
    error's first line with the frame that raised it and the call it came through, or the figures of what worked."""
    given: set = set()
    for t in tries:
        added = [k for k in t.numbers if k not in given]
        given |= set(t.numbers) if t.call == "deepspeed.initialize" else set()
        print(f"{t.call} · {t.label}" + (f" (numbers for: {', '.join(added)})" if added and t.call != "zero.Init" else ""))
        if t.error:
            print(f"    {t.error}")
            print(f"    raised in {t.where[-1]}, reached through {t.where[0]}")
        elif t.call == "zero.Init":
            print(f"    works: the token embedding holds {t.local_numel} of its {t.ds_numel} elements on this rank (partitioned)")
        else:
            print(f"    works: train_batch_size {t.train_batch_size}, reduce_bucket_size {t.reduce_bucket_size:,}, "
                  f"fp16 {t.fp16}; losses of {len(t.losses)} steps: {[round(x, 5) for x in t.losses]}")


def logged_steps(log: str) -> list[dict[str, float]]:
    """The Trainer's per-step log lines in a launch's log, as numbers, in order: rank 0 prints one dict per logging
    step (``{'loss': '6.72', 'grad_norm': '1.161', 'learning_rate': '0', 'epoch': '0.01562'}``; transformers 5 writes
    each value as a string). The summary line at the end of training (``train_runtime``, ``train_loss``) is left out."""
    import ast

    rows = []
    for line in log.splitlines():
        text = line.split("] ", 1)[-1].strip()
        if text.startswith("{'loss'"):
            rows.append({key: float(value) for key, value in ast.literal_eval(text).items()})
    return rows


def configs_that_look_right(written: dict, args: Any, steps: int, world_size: int) -> dict[str, Any]:
    """Two configs that look right and still stop a Trainer launch, each read by the libraries themselves and by the
    course's pre-check (:func:`course_utils.kernel.configs.diagnose`):

    - ``written`` with its micro-batch size in quotes (``"2"``): transformers' ``trainer_config_process`` /
      ``trainer_config_finalize`` with ``args`` (``steps`` training steps) and what they raise;
    - a file with a comment and a trailing comma: DeepSpeed's ``DeepSpeedConfig`` reads the path (hjson), the
      Trainer's ``HfDeepSpeedConfig`` (accelerate's: json) and what it raises; the file is gone afterwards.

    Prints each verdict; returns them for the page's checks and its record."""
    import copy
    import json
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    from accelerate.utils.deepspeed import HfDeepSpeedConfig as AccelerateConfig
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from course_utils.kernel import configs
    from course_utils.kernel.config_doctor import world_of

    out: dict[str, Any] = {}
    quoted = copy.deepcopy(written)
    quoted["train_micro_batch_size_per_gpu"] = str(args.per_device_train_batch_size)
    hf = HfTrainerDeepSpeedConfig(quoted)
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=32)), steps)
        out["quoted_transformers"] = ""
    except ValueError as err:
        out["quoted_transformers"] = str(err)
    out["quoted_doctor"] = configs.diagnose(quoted, world_size, trainer=True).errors
    print(f'1. "train_micro_batch_size_per_gpu": "{args.per_device_train_batch_size}" (in quotes) with '
          f"per_device_train_batch_size={args.per_device_train_batch_size}:")
    print("   transformers: " + (out["quoted_transformers"].replace("\n", "\n   ") or "accepted"))
    print("   the pre-check: " + ("\n   ".join(out["quoted_doctor"]) or "accepted"))

    text = ('{\n  // two sequences per rank, one step per batch\n  "train_micro_batch_size_per_gpu": 2,\n'
            '  "gradient_accumulation_steps": 1,\n  "zero_optimization": {"stage": 2},\n}\n')
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ds_config.json"
        path.write_text(text)
        with world_of(world_size):
            out["commented_deepspeed_stage"] = DeepSpeedConfig(str(path)).zero_optimization_stage
        try:
            AccelerateConfig(str(path))
            out["commented_trainer"] = ""
        except json.JSONDecodeError as err:
            out["commented_trainer"] = f"json.decoder.JSONDecodeError: {err}"
        verdict = configs.diagnose(path, world_size)
        out["commented_doctor_plain"] = [w.replace(str(path), "ds_config.json") for w in verdict.warnings]
        out["commented_doctor_plain_errors"] = verdict.errors
        out["commented_doctor_trainer"] = [e.replace(str(path), "ds_config.json")
                                           for e in configs.diagnose(path, world_size, trainer=True).errors]
    print("\n2. ds_config.json, with a comment and a trailing comma:\n   " + text.replace("\n", "\n   ").rstrip())
    print(f"   DeepSpeed (DeepSpeedConfig(path), hjson): read, ZeRO stage {out['commented_deepspeed_stage']}")
    print("   the Trainer (HfDeepSpeedConfig(path), json): " + (out["commented_trainer"] or "read"))
    print("   the pre-check, plain launch: " + "; ".join(out["commented_doctor_plain"]))
    print("   the pre-check, Trainer launch: " + "\n   ".join(out["commented_doctor_trainer"]))
    return out


class OnRanks:
    """``TrainingArguments`` as ``world_size`` ranks see them, for transformers' fill methods run in this kernel:
    ``TrainingArguments`` here counts one process, the Trainer on N ranks counts N (``train_batch_size``)."""

    def __init__(self, args, world_size: int):
        self.args, self.world_size = args, world_size

    def __getattr__(self, name: str):
        return getattr(self.args, name)
