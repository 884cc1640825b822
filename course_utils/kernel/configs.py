"""Load and check DeepSpeed configs before any rank starts (the runner's pre-check).

DeepSpeed reports many config mistakes late (after the ranks have started), one at a time, or not at all: a
misspelt top-level key is silently ignored, an option the chosen ZeRO stage does not use does nothing.
:func:`validate` reads the config with DeepSpeed's own config classes and the launch's world size
(:mod:`course_utils.kernel.config_doctor`) and adds the checks DeepSpeed leaves out. The rule is to agree with
DeepSpeed: everything that would stop DeepSpeed comes back together in one :class:`ConfigError` naming each key
and the fix, and nothing else does. What DeepSpeed would ignore (a top-level key like no DeepSpeed option, said
loudly when its name is close to one; an option the ZeRO stage does not read) is a one-line warning, and the
launch goes on; a note to the config's readers (``"_comment"``) passes without a word.
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
# DeepSpeed's 1-bit / 0-1 optimizers, by the names DeepSpeed v0.19.5's deepspeed/runtime/config.py gave them (lines
# 75-77: ONEBIT_ADAM_OPTIMIZER = 'onebitadam', ZERO_ONE_ADAM_OPTIMIZER = 'zerooneadam', ONEBIT_LAMB_OPTIMIZER =
# 'onebitlamb'; a config's type is compared lower-cased), each with the optimizer to write instead and the reason
# that version refused it under ZeRO: deepspeed/runtime/engine.py, _configure_basic_optimizer, lines 2108, 2115 and
# 2122, `assert not self.zero_optimization(), "..."`, where zero_optimization() is zero_optimization.stage > 0
# (config.py line 804). They were removed after 0.19.5: 0.19.8
# refuses their names as it refuses any unknown optimizer (engine.py _do_sanity_check, about line 2018,
# "{} is not a supported DeepSpeed Optimizer").
_ONE_BIT_OPTIMIZERS = {"onebitadam": ("Adam", "1bit-Adam is not compatible with ZeRO"),
                       "zerooneadam": ("Adam", "0/1 Adam is not compatible with ZeRO"),
                       "onebitlamb": ("Lamb", "1bit-Lamb is not compatible with ZeRO")}
_BATCH_KEYS = doctor.BATCH_KEYS


class ConfigError(ValueError):
    """A DeepSpeed config the course will not launch; the message names the key and the fix."""


def load(config: dict | str | Path) -> tuple[dict, str]:
    """A config as a dict plus a name for messages. Relative paths are also looked up in configs/."""
    data, name, refused = _load(config)
    if refused:
        raise ConfigError(refused)
    return data, name


def _load(config: dict | str | Path) -> tuple[dict, str, str]:
    """:func:`load`'s reading, plus json's refusal of a file that only DeepSpeed's own reader (hjson) accepts:
    ``(config, name, "")`` for a file json reads, ``(config, name, json's refusal)`` for one with trailing commas or
    comments that hjson reads, :class:`ConfigError` when neither reads it."""
    if isinstance(config, dict):
        return copy.deepcopy(config), "<dict>", ""
    path = Path(config)
    if not path.exists() and (CONFIGS / path).exists():
        path = CONFIGS / path
    if not path.exists():
        available = ", ".join(sorted(p.name for p in CONFIGS.glob("*.json")))
        raise ConfigError(f"Config file {config} does not exist. Configs shipped with the course: {available}")
    text = path.read_text()
    twice: list[str] = []
    refused = ""
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, twice))
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if e.lineno <= len(text.splitlines()) else ""
        refused = (f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}:\n"
                   f"    {line}\n    {' ' * (e.colno - 1)}^\n"
                   f"(JSON allows no trailing commas, comments or single quotes.)")
        data = _read_as_deepspeed_does(text, twice)
        if data is None:
            raise ConfigError(refused) from None
    if twice:
        keys = list(dict.fromkeys(twice))
        raise ConfigError(f"{path}: {', '.join(map(repr, keys))} {'appears' if len(keys) == 1 else 'appear'} twice "
                          f"in the same {{...}}. DeepSpeed refuses a config file with a repeated key (json would silently keep "
                          f"the last one); keep one of them.")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object {{...}}, not {type(data).__name__}.")
    return data, str(path), refused


def _read_as_deepspeed_does(text: str, twice: list[str]) -> dict | None:
    """The file as DeepSpeed reads a config path (``DeepSpeedConfig.__init__``: ``hjson.load`` with
    ``dict_raise_error_on_duplicate_keys``), which takes trailing commas and comments; None when hjson refuses it too."""
    import hjson

    try:
        data = hjson.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, twice))
    except hjson.HjsonDecodeError:
        return None
    return json.loads(json.dumps(data))         # hjson's OrderedDicts as plain dicts


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
    cfg, name, json_refused = _load(config)
    out = Diagnosis(name=name, world_size=world_size, config=cfg)
    if json_refused:
        out.errors += [_json_only_problem(json_refused)] if trainer else []
        out.warnings += [] if trainer else [_json_only_warning(json_refused)]
    if trainer:
        out.errors += _quoted_values_the_trainer_compares(cfg)
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


def deepspeed_verdict(config: dict | str | Path, world_size: int = 1) -> tuple[Any, str]:
    """DeepSpeed's own verdict on a config for ``world_size`` ranks, with nothing of the course's added:
    ``(DeepSpeedConfig, "")`` when it accepts the config, ``(None, what it raised)`` when not — the error that
    ``deepspeed.initialize`` would stop every rank of such a launch with."""
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg, _ = load(config)
    try:
        with doctor.world_of(world_size):
            return DeepSpeedConfig(copy.deepcopy(cfg)), ""
    except Exception as e:          # whatever DeepSpeed's code raised: that is its verdict
        return None, f"{type(e).__name__}: {e}"


def _checked(config: dict | str | Path, world_size: int, trainer: bool) -> Diagnosis:
    verdict = diagnose(config, world_size, trainer)
    if verdict.errors:
        raise ConfigError(verdict.error_message())
    if verdict.warnings:
        print(verdict.warning_line(), flush=True)
    return verdict


def _check_top_level(reading: doctor.Reading, out: Diagnosis) -> None:
    """A top-level key DeepSpeed never reads is a warning, never an error: ``DeepSpeedConfig`` asks for the keys it
    knows and never looks at the rest, so DeepSpeed runs the config without it. A likely typo (close to a key
    DeepSpeed reads, like ``comms_config``) is said loudly, naming that key; a note (``_comment``) not at all."""
    known = sorted(k for k in reading.read if k not in doctor.removed_keys())
    typos, others = [], []
    for key in (k for k in reading.config if k not in reading.read and not doctor.is_note(k)):
        close = difflib.get_close_matches(str(key), known, n=1)
        if close:
            typos.append(f"LIKELY TYPO: DeepSpeed ignores the top-level key {key!r} and all it holds (no DeepSpeed "
                         f"option has this name); did you mean {close[0]!r}? Rename it, or it has no effect")
        else:
            others.append(f"DeepSpeed ignores the top-level key {key!r} (no DeepSpeed option has this name)")
    out.warnings += typos + others          # the likely typos first


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
    return [problem for problem in (_optimizer_problem(cfg), _scheduler_problem(cfg)) if problem]


def _optimizer_problem(cfg: dict) -> str | None:
    """An optimizer type the engine's ``_is_supported_optimizer`` refuses (its list, lower-cased, or torch.optim)."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    opt = _section_type(cfg, "optimizer")
    if opt is None or opt == "auto" or str(opt).lower() in DEEPSPEED_OPTIMIZERS \
            or getattr(torch.optim, str(opt), None) is not None:
        return None
    if str(opt).lower() in _ONE_BIT_OPTIMIZERS:
        return _one_bit_problem(cfg, str(opt))
    choices = ["Adam", "AdamW", "Lamb", "Lion", "Adagrad"] + [n for n in dir(torch.optim) if n[0].isupper()]
    close = difflib.get_close_matches(str(opt), choices, n=1)
    return (f"optimizer.type: {opt!r} is neither a DeepSpeed optimizer ({', '.join(DEEPSPEED_OPTIMIZERS)}) "
            f"nor a torch.optim class, so deepspeed.initialize would refuse it."
            + (f" Did you mean {close[0]!r}?" if close else " Pick one of those."))


def _one_bit_problem(cfg: dict, opt: str) -> str:
    """A 1-bit / 0-1 optimizer is a real DeepSpeed optimizer that this DeepSpeed no longer has: say so, what to
    write instead (without the settings only the 1-bit optimizer took, which the replacement's constructor would
    refuse), and, under ZeRO, why even the DeepSpeed versions that had it would refuse this config."""
    import inspect
    import deepspeed
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.ops.lamb import FusedLamb

    instead, zero_reason = _ONE_BIT_OPTIMIZERS[opt.lower()]
    takes = inspect.signature({"Adam": FusedAdam, "Lamb": FusedLamb}[instead]).parameters  # what the engine builds
    params = cfg["optimizer"].get("params")
    extra = [k for k in params if k not in takes] if isinstance(params, dict) else []
    text = (f"optimizer.type: {opt!r} is one of DeepSpeed's 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb), "
            f"which DeepSpeed {deepspeed.__version__} no longer ships (0.19.5 still had them), so "
            f"deepspeed.initialize would refuse it. Write {instead!r} instead")
    if extra:
        text += f" and remove optimizer.params.{', '.join(extra)}, which only the 1-bit optimizer took"
    zero = cfg.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    if isinstance(stage, int) and stage > 0:
        text += (f". Even the DeepSpeed versions that had it refuse it with ZeRO stage {stage} (\"{zero_reason}\"): "
                 f"there it needs zero_optimization.stage 0")
    return text + "."


def _scheduler_problem(cfg: dict) -> str | None:
    """A scheduler type the engine finds neither in ``lr_schedules`` nor in ``torch.optim.lr_scheduler``."""
    import torch
    from deepspeed.runtime import lr_schedules

    sched = _section_type(cfg, "scheduler")
    if sched is None or sched == "auto" or hasattr(lr_schedules, str(sched)) \
            or hasattr(torch.optim.lr_scheduler, str(sched)):
        return None
    close = difflib.get_close_matches(str(sched), lr_schedules.VALID_LR_SCHEDULES, n=1)
    return (f"scheduler.type: {sched!r} is not a DeepSpeed scheduler ({', '.join(lr_schedules.VALID_LR_SCHEDULES)}) "
            f"nor a torch.optim.lr_scheduler class."
            + (f" Did you mean {close[0]!r}?" if close else " Pick one of those."))


_READERS = ("DeepSpeed reads a config file with hjson (deepspeed/runtime/config.py, DeepSpeedConfig.__init__), which "
            "takes trailing commas and comments; the Hugging Face Trainer and accelerate read it with json.load "
            "(accelerate/utils/deepspeed.py, HfDeepSpeedConfig)")


def _json_only_problem(refused: str) -> str:
    """A Trainer (or accelerate) launch of a file only hjson reads: where json stops, and why DeepSpeed alone would not."""
    return (f"{refused}\n    {_READERS}, so a Trainer launch stops there, before any rank trains. "
            f"Remove the trailing commas and comments (a note can be a key: \"_comment\": \"...\").")


def _json_only_warning(refused: str) -> str:
    first = refused.splitlines()[0].rstrip(":")
    return (f"{first}; {_READERS}: this plain DeepSpeed launch reads it, the same file given to the Trainer or "
            f"accelerate would stop at that line")


def _as_number_or_boolean(value: Any) -> Any:
    """What a string holds when it is a number or a boolean written in quotes ("8", "3e-5", "true"); None otherwise."""
    if not isinstance(value, str) or value == "auto":
        return None
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    try:
        number = json.loads(value)
    except json.JSONDecodeError:
        return None
    return number if isinstance(number, (int, float)) and not isinstance(number, bool) else None


def trainer_compared_keys() -> dict[str, str]:
    """Every config key the Hugging Face Trainer compares with one of its arguments, and that argument: read from
    transformers itself, by running ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
    ``trainer_config_finalize`` with a recorder in place of ``fill_match`` (the calls that must match)."""
    from unittest import mock
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    compared: dict[str, str] = {}

    def record(self: Any, ds_key_long: str, hf_val: Any, hf_key: str | None = None, must_match: bool = True) -> None:
        if must_match:
            compared[ds_key_long] = hf_key or ds_key_long

    class Arguments:                 # any argument the two methods read; their values do not matter here
        def __getattr__(self, name: str) -> Any:
            return 1

        def get_warmup_steps(self, steps: int) -> int:
            return 1

    with mock.patch.object(HfTrainerDeepSpeedConfig, "fill_match", record):
        config = HfTrainerDeepSpeedConfig({})
        config.trainer_config_process(Arguments(), auto_find_batch_size=False)
        config.trainer_config_finalize(Arguments(), None, 1)
    return compared


def _quoted_values_the_trainer_compares(cfg: dict) -> list[str]:
    """Numbers and booleans written as strings where the Trainer compares the value with its argument: transformers'
    ``fill_match`` compares ``"8" != 8`` and stops the start of training with a mismatch whose two sides can print
    alike ("ds x=8 vs hf y=8")."""
    quoted = {k: (v, _as_number_or_boolean(v)) for k, v in leaf_paths(cfg).items()
              if _as_number_or_boolean(v) is not None}
    if not quoted:
        return []
    compared = trainer_compared_keys()
    return [f"{key}: {text!r} is a string, and the Trainer compares it as it is with its argument {compared[key]} "
            f"(transformers' HfTrainerDeepSpeedConfig.fill_match: {text!r} != {json.dumps(value)}): the start of "
            f"training stops with \"Please correct the following DeepSpeed config values that mismatch "
            f"TrainingArguments values: - ds {key}={text} vs hf {compared[key]}=…\" (the two sides can print "
            f"alike). Write {json.dumps(value)} without quotes, or \"auto\"."
            for key, (text, value) in quoted.items() if key in compared]
