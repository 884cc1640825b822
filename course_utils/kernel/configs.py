"""Load and check DeepSpeed configs before any rank starts (the runner's pre-check).

DeepSpeed reports many config mistakes late (after the ranks have started), one at a time, or not at all: a
misspelt top-level key is silently ignored, an option the chosen ZeRO stage does not use does nothing.
:func:`validate` reads the config with DeepSpeed's own config classes and the launch's world size
(:mod:`course_utils.kernel.config_doctor`) and adds the checks DeepSpeed leaves out. Everything that would stop
DeepSpeed, or that DeepSpeed would take for something else (a likely typo), comes back together in one
:class:`ConfigError` naming each key and the fix; what DeepSpeed would merely ignore (a top-level key like no
DeepSpeed option, an option the ZeRO stage does not read) is a one-line warning, and the launch goes on.
"""
from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.kernel import config_doctor as doctor
from course_utils.common.paths import CONFIGS

# ZeRO options that only stage 3 reads; with a lower stage they do nothing.
_STAGE3_ONLY_PREFIX = "stage3_"
_STAGE3_ONLY = {"offload_param", "sub_group_size", "zero_hpz_partition_size", "zero_quantized_weights",
                "zero_quantized_nontrainable_weights", "mics_shard_size", "mics_hierarchical_params_gather",
                "memory_efficient_linear", "module_granularity_threshold", "param_persistence_threshold",
                "model_persistence_threshold", "max_live_parameters", "max_reuse_distance",
                "prefetch_bucket_size", "gather_16bit_weights_on_model_save"}
# ZeRO options that need a ZeRO optimizer (stage >= 1).
_ZERO_ONLY = {"offload_optimizer", "overlap_comm", "contiguous_gradients", "reduce_scatter",
              "reduce_bucket_size", "allgather_partitions", "allgather_bucket_size"}
_BATCH_KEYS = doctor.BATCH_KEYS


class ConfigError(ValueError):
    """A DeepSpeed config the course will not launch; the message names the key and the fix."""


def load(config: dict | str | Path) -> tuple[dict, str]:
    """A config as a dict plus a name for messages. Relative paths are also looked up in configs/."""
    if isinstance(config, dict):
        return copy.deepcopy(config), "<dict>"
    path = Path(config)
    if not path.exists() and (CONFIGS / path).exists():
        path = CONFIGS / path
    if not path.exists():
        available = ", ".join(sorted(p.name for p in CONFIGS.glob("*.json")))
        raise ConfigError(f"Config file {config} does not exist. Configs shipped with the course: {available}")
    text = path.read_text()
    twice: list[str] = []
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, twice))
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if e.lineno <= len(text.splitlines()) else ""
        raise ConfigError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}:\n"
                          f"    {line}\n    {' ' * (e.colno - 1)}^\n"
                          f"(JSON allows no trailing commas, comments or single quotes.)") from None
    if twice:
        keys = list(dict.fromkeys(twice))
        raise ConfigError(f"{path}: {', '.join(map(repr, keys))} {'appears' if len(keys) == 1 else 'appear'} twice "
                          f"in the same {{...}}. DeepSpeed refuses a config file with a repeated key (json would silently keep "
                          f"the last one); keep one of them.")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object {{...}}, not {type(data).__name__}.")
    return data, str(path)


def _no_duplicates(pairs: list[tuple[str, Any]], twice: list[str]) -> dict:
    """An object of the file, noting keys it repeats (DeepSpeed reads files with
    ``dict_raise_error_on_duplicate_keys``)."""
    keys = [k for k, _ in pairs]
    twice += [k for i, k in enumerate(keys) if k in keys[:i]]
    return dict(pairs)


def leaf_paths(config: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested config as ``{"a.b.c": value}``, in the config's order."""
    if isinstance(config, dict):
        return {k: v for key, sub in config.items() for k, v in leaf_paths(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: config}


def auto_keys(config: dict) -> list[str]:
    """Dotted paths of every "auto" value in a config (what the Hugging Face Trainer must fill)."""
    return [k for k, v in leaf_paths(config).items() if isinstance(v, str) and v == "auto"]


def without_auto(cfg: dict) -> dict:
    """The config with every "auto" removed, as DeepSpeed would see it before the Trainer fills it."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if v != "auto"}
        return node
    out = strip(cfg)
    if any(cfg.get(k) == "auto" for k in _BATCH_KEYS):   # the Trainer derives all three together
        for k in _BATCH_KEYS:
            out.pop(k, None)
        out["train_micro_batch_size_per_gpu"] = 1
    return out


@dataclass
class Diagnosis:
    """The pre-check's verdict on a config: ``errors`` stop the launch, ``warnings`` only say what DeepSpeed
    will ignore. ``parsed`` is DeepSpeed's ``DeepSpeedConfig`` of it (None when DeepSpeed could not read it)."""
    name: str
    world_size: int
    config: dict
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    parsed: Any = None

    def error_message(self) -> str:
        count = f"{len(self.errors)} problems" if len(self.errors) > 1 else "1 problem"
        return (f"{self.name} (world size {self.world_size}): {count} to fix before launching:\n"
                + "\n".join(f"  - {e}" for e in self.errors))

    def warning_line(self) -> str:
        return f"Config warning ({self.name}): " + "; ".join(self.warnings) + ". The launch goes on."


def diagnose(config: dict | str | Path, world_size: int = 1, trainer: bool = False) -> Diagnosis:
    """Every problem and every warning of a config for a launch of ``world_size`` ranks, without raising
    (except :class:`ConfigError` for a file that is missing or not JSON)."""
    cfg, name = load(config)
    out = Diagnosis(name=name, world_size=world_size, config=cfg)
    autos = auto_keys(cfg)
    if autos and not trainer:
        out.errors.append(f"{', '.join(autos)}: \"auto\" values are filled in only by the Hugging Face Trainer. "
                          f"For a plain deepspeed.initialize script, write numbers instead; for a Trainer script, "
                          f"validate/launch with trainer=True.")
    reading = doctor.read(without_auto(cfg) if autos else cfg, world_size)
    out.errors += reading.problems
    out.parsed = reading.parsed if not reading.problems else None
    if reading.parsed is not None:
        _check_top_level(reading, out)
        if not {"zero_optimization", "zero_optimization.stage"} & set(reading.dropped):
            out.warnings += _stage_warnings(reading.config, reading.parsed.zero_optimization_stage)
    out.errors += _optimizer_and_scheduler_problems(reading.config)
    return out


def validate(config: dict | str | Path, world_size: int = 1, trainer: bool = False) -> dict:
    """Check a DeepSpeed config for a launch of ``world_size`` ranks; return it as a dict.

    Raises :class:`ConfigError` listing every problem; prints the warnings on one line.
    ``trainer=True`` allows "auto" values, which only the Hugging Face Trainer fills in.
    """
    return _checked(config, world_size, trainer).config


def parse(config: dict | str | Path, world_size: int = 1) -> Any:
    """DeepSpeed's own reading of a config for ``world_size`` ranks (its ``DeepSpeedConfig``: resolved batch
    sizes, ``zero_config``, precision), after the same checks as :func:`validate`."""
    return _checked(config, world_size, trainer=False).parsed


def _checked(config: dict | str | Path, world_size: int, trainer: bool) -> Diagnosis:
    verdict = diagnose(config, world_size, trainer)
    if verdict.errors:
        raise ConfigError(verdict.error_message())
    if verdict.warnings:
        print(verdict.warning_line(), flush=True)
    return verdict


def _check_top_level(reading: doctor.Reading, out: Diagnosis) -> None:
    """A top-level key DeepSpeed never reads: a likely typo (close to a key it reads) is an error, anything else
    a warning, since DeepSpeed ignores it."""
    known = sorted(k for k in reading.read if k not in doctor.removed_keys())
    for key in (k for k in reading.config if k not in reading.read):
        close = difflib.get_close_matches(str(key), known, n=1)
        if close:
            out.errors.append(f"{key}: DeepSpeed has no top-level option of this name and would ignore it "
                              f"silently; did you mean {close[0]!r}? Rename it.")
        else:
            out.warnings.append(f"DeepSpeed ignores the top-level key {key!r} (no DeepSpeed option has this name)")


def _stage_warnings(cfg: dict, stage: int) -> list[str]:
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict):
        return []
    found = []
    if stage < 3:
        ignored = [k for k in zero if k.startswith(_STAGE3_ONLY_PREFIX) or k in _STAGE3_ONLY]
        if ignored:
            found.append(f"zero_optimization.{', '.join(ignored)} only acts in ZeRO stage 3, but stage is {stage}, "
                         f"so DeepSpeed ignores {'it' if len(ignored) == 1 else 'them'}")
    if stage == 0:
        ignored = [k for k in zero if k in _ZERO_ONLY]
        if ignored:
            found.append(f"zero_optimization.{', '.join(ignored)} needs ZeRO (stage ≥ 1), but stage is 0, so "
                         f"DeepSpeed ignores {'it' if len(ignored) == 1 else 'them'}")
    return found


def _section_type(cfg: dict, section: str) -> Any:
    node = cfg.get(section)
    return node.get("type") if isinstance(node, dict) else None


def _optimizer_and_scheduler_problems(cfg: dict) -> list[str]:
    """Types ``DeepSpeedConfig`` accepts but ``deepspeed.initialize`` refuses (the engine's
    ``_is_supported_optimizer`` and its scheduler lookup in ``lr_schedules`` or ``torch.optim.lr_scheduler``)."""
    import torch
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    found = []
    opt = _section_type(cfg, "optimizer")
    if opt is not None and opt != "auto":
        if str(opt).lower() not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, str(opt), None) is None:
            choices = ["Adam", "AdamW", "Lamb", "Lion", "Adagrad"] + [n for n in dir(torch.optim) if n[0].isupper()]
            close = difflib.get_close_matches(str(opt), choices, n=1)
            found.append(f"optimizer.type: {opt!r} is neither a DeepSpeed optimizer ({', '.join(DEEPSPEED_OPTIMIZERS)}) "
                         f"nor a torch.optim class, so deepspeed.initialize would refuse it."
                         + (f" Did you mean {close[0]!r}?" if close else " Pick one of those."))
    sched = _section_type(cfg, "scheduler")
    if sched is not None and sched != "auto":
        if not hasattr(lr_schedules, str(sched)) and not hasattr(torch.optim.lr_scheduler, str(sched)):
            close = difflib.get_close_matches(str(sched), lr_schedules.VALID_LR_SCHEDULES, n=1)
            found.append(f"scheduler.type: {sched!r} is not a DeepSpeed scheduler "
                         f"({', '.join(lr_schedules.VALID_LR_SCHEDULES)}) nor a torch.optim.lr_scheduler class."
                         + (f" Did you mean {close[0]!r}?" if close else " Pick one of those."))
    return found
