"""Notebook 12's tables and checks, read from what ``scripts/12_adapters.py`` recorded, and the hand-off of an
adapter without DeepSpeed: load it on the base model, merge it, compare logits."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from course_utils.common.records.adapters import AdapterMemory, AdapterState, Zero3Load
from course_utils.rank.adapters import expected_bytes
from course_utils.rank.comms import total_bytes
from course_utils.common.record import read_as
from course_utils.kernel.views.source import show_script, show_script_function, show_source  # noqa: F401  (the notebook quotes peft, transformers, DeepSpeed and its script)

STATES = ("params", "grads", "optimizer")


def memory_rows(records: list[dict]) -> list[dict]:
    """One row per rank, stage and kind: measured bytes of each model state, the formula's, and the gap."""
    rows = []
    for m in read_as(records, AdapterMemory, rank=None):
        formula = expected_bytes(m.total, m.trainable, m.stage, m.world_size, m.persistent_numel,
                                 m.grad_partition_numel or None)
        row = {"stage": m.stage, "kind": m.kind, "rank": m.rank, "world_size": m.world_size, "total": m.total,
               "trainable": m.trainable, "peft_trainable": m.peft_trainable, "r": m.r, "targets": m.targets}
        for state in STATES + ("model_states",):
            row[state] = m.measured[state]
            row[f"{state}_formula"] = formula[state]
        row["vs_formula"] = max(abs(m.measured[s] / formula[s] - 1) for s in STATES if formula[s])
        rows.append(row)
    return rows


def lora_vs_full(rows: list[dict], rank: int = 0) -> list[dict]:
    """Rank ``rank``'s rows of the full and LoRA runs, KiB per state, measured next to the formula."""
    out = []
    for r in rows:
        if r["rank"] == rank and r["kind"] in ("full", "lora"):
            out.append({"stage": r["stage"], "kind": r["kind"], "trainable": r["trainable"],
                        **{f"{s} KiB": round(r[s] / 1024, 1) for s in STATES},
                        **{f"{s} formula KiB": round(r[f"{s}_formula"] / 1024, 1) for s in STATES},
                        "largest gap": f"{r['vs_formula']:.2%}"})
    return out


def comm_table(records: list[dict], min_bytes: int = 64) -> list[dict]:
    """Rank 0's collectives of one step per stage and kind: bytes of each op (messages of at least
    ``min_bytes``: flags and norms left out), and that in units of 4 bytes × trainable and × all parameters."""
    out = []
    for m in read_as(records, AdapterMemory):
        if m.kind == "exercise":
            continue
        for op, nbytes in sorted(total_bytes(m.messages, min_bytes).items()):
            if nbytes:
                out.append({"stage": m.stage, "kind": m.kind, "collective": op, "bytes": nbytes,
                            "× 4·trainable": round(nbytes / (4 * m.trainable), 3),
                            "× 4·all/N": round(nbytes * m.world_size / (4 * m.total), 3)})
    return out


def load_table(records: list[dict]) -> list[Zero3Load]:
    """What each rank held at each point of loading under ZeRO-3 (elements)."""
    return read_as(records, Zero3Load, rank=None)


def rank_state_table(records: list[dict]) -> list[dict]:
    """Per rank and LoRA tensor: the shape ``get_peft_model_state_dict`` held outside a gather, the full shape,
    and whether ZeRO-3 keeps that parameter whole on every rank."""
    return [{"rank": s.rank, **t} for s in read_as(records, AdapterState, rank=None) for t in s.tensors]


def saved_tensors(folder: str | Path) -> dict[str, list[int]]:
    """The shapes of the tensors in a saved adapter (``adapter_model.safetensors``), read without peft."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "adapter_model.safetensors"), framework="pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def empty_tensors(folder: str | Path) -> list[str]:
    """The tensors of a saved adapter that hold no elements."""
    return [k for k, shape in saved_tensors(folder).items() if 0 in shape or not shape]


@contextmanager
def _quiet():
    """No "Loading weights" / "Writing model shards" bars, no notice of peft's renamed transformers call."""
    import warnings

    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        if shown:
            logging.enable_progress_bar()


def _tensors(folder: str | Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def tensor_gap(folder: str | Path, other: str | Path) -> float:
    """The largest absolute difference between two saved adapters' tensors (same names and shapes)."""
    a, b = _tensors(folder), _tensors(other)
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    return max(max_diff(a[k], b[k]) for k in a)


def whole_tensor_gaps(folder: str | Path, reference: str | Path) -> dict[str, float]:
    """For each tensor of ``folder`` that holds elements: its largest gap to the same tensor of ``reference``."""
    a, b = _tensors(folder), _tensors(reference)
    return {k: max_diff(v, b[k]) for k, v in a.items() if v.numel() and v.shape == b[k].shape}


def same_tensors(folder: str | Path, other: str | Path) -> bool:
    """Whether two saved adapters hold exactly the same tensors."""
    return tensor_gap(folder, other) == 0.0


def load_adapter(base: str | Path, folder: str | Path):
    """(PeftModel, None) — the base checkpoint with the adapter, on the CPU, no DeepSpeed — or (None, the error)."""
    from peft import PeftModel
    from transformers import GPT2LMHeadModel

    try:
        with _quiet():
            return PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(str(base)), str(folder)).eval(), None
    except Exception as err:                # what a learner would meet: shown, not hidden
        return None, f"{type(err).__name__}: {err}"


def max_diff(a: Any, b: Any) -> float:
    import torch

    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


def hand_off(base: str | Path, folder: str | Path, batch, trained_logits) -> dict[str, float]:
    """Load the adapter without DeepSpeed, merge it into the base weights (``merge_and_unload``), write the merged
    model with save_pretrained and read it back with plain transformers; the largest logit gaps between them, to
    the logits the ranks computed with the trained model, and (the yardstick) to the base model without adapter;
    and the loss of the base model and of the adapter model on ``batch``."""
    import tempfile

    import torch
    from transformers import GPT2LMHeadModel

    model, error = load_adapter(base, folder)
    if model is None:
        raise RuntimeError(f"the adapter in {folder} does not load: {error}")
    with torch.no_grad(), _quiet():
        base_logits = GPT2LMHeadModel.from_pretrained(str(base)).eval()(input_ids=batch).logits
        adapter_logits = model(input_ids=batch).logits
        merged = model.merge_and_unload()
        merged_logits = merged(input_ids=batch).logits
        with tempfile.TemporaryDirectory() as tmp:
            merged.save_pretrained(tmp)
            reloaded_logits = GPT2LMHeadModel.from_pretrained(tmp).eval()(input_ids=batch).logits
    return {"base_loss": _next_token_loss(base_logits, batch), "adapter_loss": _next_token_loss(adapter_logits, batch),
            "adapter_vs_base": max_diff(adapter_logits, base_logits),        # what training changed: the yardstick
            "adapter_vs_ranks": max_diff(adapter_logits, trained_logits),
            "merged_vs_adapter": max_diff(merged_logits, adapter_logits),
            "reloaded_vs_merged": max_diff(reloaded_logits, merged_logits),
            "merged_is_plain_gpt2": type(merged).__name__ == "GPT2LMHeadModel",
            "lora_modules_left": sum("lora" in n for n, _ in merged.named_parameters())}


def _next_token_loss(logits, ids) -> float:
    """The causal LM loss of ``logits`` on ``ids``: each position predicts the next token (what the model's own loss
    computes when given labels)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()


def adapter_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "adapter_config.json").read_text())


def one_device_table(records: list[dict]):
    """The one-rank LoRA fine-tunes (``--one_device``), a row per config: where it ran, what trained, the step time
    and the peaks of device and host memory."""
    import statistics

    import pandas as pd

    from course_utils.common.records.adapters import OneDevice

    MiB = 2**20
    return pd.DataFrame([{
        "config": o.config, "stage": o.stage, "offload": "+".join(o.offload) or "-", "device": o.device, "dtype": o.dtype,
        "model": o.model, "trainable": o.trainable, "total": o.total, "optimizer": o.optimizer,
        "step (ms, median)": round(1e3 * statistics.median_high(o.step_seconds), 1),
        "device peak reserved (MiB)": round(o.device_peak_reserved / MiB), "host peak RSS (MiB)": round(o.host_peak_rss / MiB),
        "loss first → last": f"{o.losses[0]:.3f} → {o.losses[-1]:.3f}"} for o in read_as(records, OneDevice)]).set_index("config")
