"""Notebook 08's tables: each "auto" value of a Trainer config as written, as DeepSpeed received it and
the TrainingArguments field that filled it, and what else changed on the way; and the installed source lines of
transformers or accelerate that say so (notebooks 07 and 08)."""
from __future__ import annotations

from typing import Any

from course_utils.kernel.configs import auto_keys, leaf_paths
from course_utils.common.records.trainer import AutoFill
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
