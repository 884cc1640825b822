"""DeepSpeed inside the Hugging Face Trainer: a tiny model and data set for Trainer runs, the
optimizer × scheduler combination matrix, and a record of what "auto" was filled with.

Notebooks 07 and 08 run the real Trainer on real ranks; these helpers keep their scripts short and
make every table in those notebooks come from a run, not from documentation.
"""
from __future__ import annotations

import contextlib
import copy
from functools import partialmethod
from typing import Any, Iterator

from . import models

# ---- a model and data set small enough for 2 CPU cores ------------------------------------------

VOCAB = 64
SEQ_LEN = 16


def tiny_gpt2_for_trainer(seed: int = 0):
    """A 2-layer GPT-2 language model (~40k parameters) built from a config: nothing is downloaded."""
    return models.tiny_gpt2(VOCAB, SEQ_LEN, n_embd=32, n_layer=2, n_head=2, seed=seed)


def counting_dataset(rows: int = 64, seed: int = 0):
    """A `datasets.Dataset` of token sequences that count upwards from a random start (learnable)."""
    import numpy as np
    from datasets import Dataset

    starts = np.random.default_rng(seed).integers(0, VOCAB, rows)
    ids = [[(int(s) + i) % VOCAB for i in range(SEQ_LEN)] for s in starts]
    return Dataset.from_dict({"input_ids": ids, "labels": ids}).with_format("torch")


# ---- the HF/DS optimizer × scheduler matrix ------------------------------------------------------

def combo_key(hf_opt: bool, hf_sched: bool, offload: bool) -> str:
    """``"hf_opt+ds_sched"``, with ``"+offload"`` appended for ZeRO-Offload runs."""
    key = f"{'hf' if hf_opt else 'ds'}_opt+{'hf' if hf_sched else 'ds'}_sched"
    return key + ("+offload" if offload else "")


def combos(offload_options: tuple[bool, ...] = (False, True)) -> list[tuple[bool, bool, bool]]:
    """Every (hf_opt, hf_sched, offload) combination, in the order of the documented table."""
    return [(o, s, off) for off in offload_options for o in (True, False) for s in (True, False)]


def combo_config(base: dict, hf_opt: bool, hf_sched: bool, offload: bool) -> dict:
    """``base`` with its ``optimizer``/``scheduler`` sections removed where Hugging Face provides them,
    and the optimizer offloaded to the CPU or not. A section absent from the DeepSpeed config is what
    tells the Trainer to build that piece itself."""
    cfg = copy.deepcopy(base)
    if hf_opt:
        cfg.pop("optimizer", None)
    if hf_sched:
        cfg.pop("scheduler", None)
    zero = cfg.setdefault("zero_optimization", {"stage": 2})
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    else:
        zero.pop("offload_optimizer", None)
    return cfg


def outcome(error: BaseException | None) -> str:
    """``"ok"`` or the error's class name (the value recorded in the combination matrix)."""
    return "ok" if error is None else type(error).__name__


def matrix_table(results: dict[str, dict]) -> list[dict[str, Any]]:
    """Rows (optimizer, scheduler, offload, outcome, optimizer class, error message) for display."""
    rows = []
    for key, r in results.items():
        opt, sched = key.split("+")[:2]
        rows.append({"optimizer": opt.replace("_opt", "").upper(), "scheduler": sched.replace("_sched", "").upper(),
                     "offload": key.endswith("+offload"), "outcome": r["outcome"],
                     "optimizer class": r.get("optimizer_class"), "scheduler class": r.get("scheduler_class"),
                     "error": (r.get("error") or "")[:160]})
    return rows


DOCUMENTED_TABLE = {           # the Hugging Face documentation's table, as the course's source notes give it
    "hf_opt+hf_sched": "yes", "hf_opt+ds_sched": "yes", "ds_opt+hf_sched": "no", "ds_opt+ds_sched": "yes"}


# ---- "auto": what the Trainer filled in, and from which argument ---------------------------------

@contextlib.contextmanager
def recording_auto_fills() -> Iterator[list[dict[str, Any]]]:
    """Record every ``fill_match``/``fill_only`` call of ``HfTrainerDeepSpeedConfig`` that replaces an
    "auto" value: ``{"key", "value", "from"}`` where ``from`` names the TrainingArguments field (or the
    quantity the Trainer computed). The wrapper calls the original method, so behaviour is unchanged."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig as Cfg

    filled: list[dict[str, Any]] = []
    original = Cfg.fill_match

    def fill_match(self, ds_key_long, hf_val, hf_key=None, must_match=True):
        was_auto = self.is_auto(ds_key_long)
        original(self, ds_key_long, hf_val, hf_key, must_match)
        if was_auto:
            filled.append({"key": ds_key_long, "value": hf_val, "from": hf_key or "(set by the Trainer)"})

    Cfg.fill_match = fill_match
    Cfg.fill_only = partialmethod(fill_match, must_match=False)
    try:
        yield filled
    finally:
        Cfg.fill_match = original
        Cfg.fill_only = partialmethod(original, must_match=False)


def auto_keys(config: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every "auto" value in a config (what the Trainer must fill)."""
    if isinstance(config, dict):
        return [k for key, v in config.items() for k in auto_keys(v, f"{prefix}{key}.")]
    return [prefix[:-1]] if config == "auto" else []


def get_path(config: dict, dotted: str) -> Any:
    """``get_path(cfg, "optimizer.params.lr")``; None where a level is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def resolution_table(written: dict, received: dict, filled: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per "auto" key: as written, as DeepSpeed received it, and the argument that filled it."""
    source = {f["key"]: f["from"] for f in filled}
    return [{"key": k, "written": get_path(written, k), "received by DeepSpeed": get_path(received, k),
             "filled from": source.get(k, "(not filled)")} for k in auto_keys(written)]


def leaf_paths(config: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested config as ``{"a.b.c": value}``."""
    if isinstance(config, dict):
        return {k: v for key, sub in config.items() for k, v in leaf_paths(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: config}


def other_changes(written: dict, received: dict) -> dict[str, tuple[Any, Any]]:
    """Values that changed on the way to DeepSpeed although they were not "auto": ``key → (written, received)``."""
    before, after = leaf_paths(written), leaf_paths(received)
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if before.get(k) != "auto" and before.get(k) != after.get(k)}
