"""Load and check DeepSpeed configs before any rank starts.

DeepSpeed reports many config mistakes late (after the ranks have started), cryptically, or not
at all: a misspelt top-level key is silently ignored, an option the chosen ZeRO stage does not use
does nothing. :func:`validate` runs DeepSpeed's own config classes with the launch's world size and
adds the checks DeepSpeed leaves out, raising :class:`ConfigError` that names the key and the fix.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import json
import re
from pathlib import Path
from typing import Any, Iterator

from .paths import CONFIGS

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
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


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
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if e.lineno <= len(text.splitlines()) else ""
        raise ConfigError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}:\n"
                          f"    {line}\n    {' ' * (e.colno - 1)}^\n"
                          f"(JSON allows no trailing commas, comments or single quotes.)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object {{...}}, not {type(data).__name__}.")
    return data, str(path)


def leaf_paths(config: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested config as ``{"a.b.c": value}``, in the config's order."""
    if isinstance(config, dict):
        return {k: v for key, sub in config.items() for k, v in leaf_paths(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: config}


def auto_keys(config: dict) -> list[str]:
    """Dotted paths of every "auto" value in a config (what the Hugging Face Trainer must fill)."""
    return [k for k, v in leaf_paths(config).items() if isinstance(v, str) and v == "auto"]


def _without_auto(cfg: dict) -> dict:
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


class _RecordingDict(dict):
    """A dict that remembers which keys were asked for: the keys DeepSpeed actually reads."""

    def __init__(self, *args: Any, seen: set | None = None):
        super().__init__(*args)
        self.seen = set() if seen is None else seen

    def __copy__(self) -> "_RecordingDict":
        return _RecordingDict(self, seen=self.seen)

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.seen.add(key)
        return super().__contains__(key)


class _World:
    """Stands in for torch.distributed while DeepSpeedConfig asks for rank and world size."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def get_rank(self) -> int:
        return 0

    def get_world_size(self, group: Any = None) -> int:
        return self.world_size


@contextlib.contextmanager
def _world_of(world_size: int) -> Iterator[None]:
    import deepspeed.runtime.config as ds_config
    real = ds_config.dist
    ds_config.dist = _World(world_size)
    try:
        yield
    finally:
        ds_config.dist = real


def _deepspeed_parse(cfg: dict, world_size: int, name: str) -> tuple[Any, set]:
    """Run DeepSpeed's own DeepSpeedConfig; return it and the top-level keys it read."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    recording = _RecordingDict(cfg)
    try:
        with _world_of(world_size):
            parsed = DeepSpeedConfig(recording)
    except ValidationError as e:
        problems = [f"  {_key_path(cfg, err['loc'])}: {_problem(err, _model_fields(e.title))}" for err in e.errors()]
        raise ConfigError(f"DeepSpeed rejects {name}:\n" + "\n".join(problems)) from None
    except (AssertionError, ValueError, KeyError, TypeError) as e:
        hint = _batch_hint(world_size) if "batch" in str(e) else ""
        raise ConfigError(f"DeepSpeed rejects {name} (world size {world_size}): {e}{hint}") from None
    return parsed, recording.seen


def _problem(err: dict, fields: list[str]) -> str:
    """One pydantic error of DeepSpeed's config model, said plainly.

    Pydantic's own wording is clumsy for configs: an enum error lists DeepSpeed's aliases
    ("0, 1, 2, 3 or 3" for the stage, whose enum has ``max_stage = 3``), and an unknown key reads
    "Extra inputs are not permitted". A spelling suggestion is offered only for an unknown key.
    """
    given = json.dumps(err.get("input"), default=str)
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        close = difflib.get_close_matches(key, fields, n=1)
        return ("DeepSpeed has no such option" + (f"; did you mean {close[0]!r}?" if close else
                                                  f". Options here: {', '.join(sorted(set(fields)))}"))
    if err["type"] == "enum":
        choices = list(dict.fromkeys(c.strip() for c in re.split(r",| or ", err["ctx"]["expected"]) if c.strip()))
        return f"{given} is not allowed; use one of {', '.join(choices)}"
    return f"{given} is not allowed: {err['msg'][0].lower()}{err['msg'][1:]}"


def _batch_hint(world_size: int) -> str:
    return (f"\nBatch sizes must satisfy train_batch_size = train_micro_batch_size_per_gpu × "
            f"gradient_accumulation_steps × world_size ({world_size} here); give any two and DeepSpeed "
            f"derives the third.")


def _model_fields(model_name: str) -> list[str]:
    """Field names and aliases of DeepSpeed's pydantic config model called ``model_name``."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    stack = [DeepSpeedConfigModel]
    while stack:
        cls = stack.pop()
        if cls.__name__ == model_name:
            return [n for name, f in cls.model_fields.items() for n in (name, f.alias) if n]
        stack.extend(cls.__subclasses__())
    return []


def _key_path(cfg: dict, loc: tuple) -> str:
    """Where a pydantic error points, as a dotted path from the top of the config."""
    inner = ".".join(str(p) for p in loc)
    if loc and loc[0] not in cfg:
        for section, value in cfg.items():
            if isinstance(value, dict) and loc[0] in value:
                return f"{section}.{inner}"
    return inner


def _check_top_level(cfg: dict, read: set, name: str) -> None:
    unknown = [k for k in cfg if k not in read]
    if unknown:
        lines = []
        for k in unknown:
            close = difflib.get_close_matches(k, sorted(str(x) for x in read), n=1)
            lines.append(f"  {k!r}" + (f": did you mean {close[0]!r}?" if close else ""))
        raise ConfigError(f"{name}: DeepSpeed never reads these top-level keys, so they would be ignored "
                          f"silently:\n" + "\n".join(lines) + "\nRename or remove them.")


def _check_stage_options(cfg: dict, stage: int, name: str) -> None:
    zero = cfg.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        return
    if stage < 3:
        ignored = [k for k in zero if k.startswith(_STAGE3_ONLY_PREFIX) or k in _STAGE3_ONLY]
        if ignored:
            raise ConfigError(f"{name}: zero_optimization.{ignored[0]} only acts in ZeRO stage 3, but stage is "
                              f"{stage}, so it would do nothing. Set \"stage\": 3 or remove "
                              f"{', '.join(ignored)}.")
    if stage == 0:
        ignored = [k for k in zero if k in _ZERO_ONLY]
        if ignored:
            raise ConfigError(f"{name}: zero_optimization.{ignored[0]} needs ZeRO (stage ≥ 1), but stage is 0, "
                              f"so it would do nothing. Raise the stage or remove {', '.join(ignored)}.")


def _check_optimizer_and_scheduler(cfg: dict, name: str) -> None:
    import torch
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    opt = (cfg.get("optimizer") or {}).get("type")
    if opt is not None and opt != "auto":
        if str(opt).lower() not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, str(opt), None) is None:
            choices = ["Adam", "AdamW", "Lamb", "Lion", "Adagrad"] + [n for n in dir(torch.optim) if n[0].isupper()]
            close = difflib.get_close_matches(str(opt), choices, n=1)
            raise ConfigError(f"{name}: optimizer.type {opt!r} is neither a DeepSpeed optimizer "
                              f"({', '.join(DEEPSPEED_OPTIMIZERS)}) nor a torch.optim class."
                              + (f" Did you mean {close[0]!r}?" if close else ""))
    sched = (cfg.get("scheduler") or {}).get("type")
    if sched is not None and sched != "auto":
        if not hasattr(lr_schedules, str(sched)) and not hasattr(torch.optim.lr_scheduler, str(sched)):
            close = difflib.get_close_matches(str(sched), lr_schedules.VALID_LR_SCHEDULES, n=1)
            raise ConfigError(f"{name}: scheduler.type {sched!r} is not a DeepSpeed scheduler "
                              f"({', '.join(lr_schedules.VALID_LR_SCHEDULES)}) nor a torch.optim.lr_scheduler "
                              f"class." + (f" Did you mean {close[0]!r}?" if close else ""))


def validate(config: dict | str | Path, world_size: int = 1, trainer: bool = False) -> dict:
    """Check a DeepSpeed config for a launch of ``world_size`` ranks; return it as a dict.

    ``trainer=True`` allows "auto" values, which only the Hugging Face Trainer fills in.
    """
    return _checked(config, world_size, trainer)[0]


def parse(config: dict | str | Path, world_size: int = 1) -> Any:
    """DeepSpeed's own reading of a config for ``world_size`` ranks (its ``DeepSpeedConfig``: resolved batch
    sizes, ``zero_config``, precision), after the same checks as :func:`validate`."""
    return _checked(config, world_size, trainer=False)[1]


def _checked(config: dict | str | Path, world_size: int, trainer: bool) -> tuple[dict, Any]:
    cfg, name = load(config)
    autos = auto_keys(cfg)
    if autos and not trainer:
        raise ConfigError(f"{name}: \"auto\" values ({', '.join(autos)}) are filled in only by the Hugging Face "
                          f"Trainer. For a plain deepspeed.initialize script, write numbers instead; for a "
                          f"Trainer script, validate/launch with trainer=True.")
    checked = _without_auto(cfg) if trainer else cfg
    parsed, read = _deepspeed_parse(checked, world_size, name)
    _check_top_level(checked, read, name)
    _check_stage_options(checked, parsed.zero_optimization_stage, name)
    _check_optimizer_and_scheduler(checked, name)
    return cfg, parsed
