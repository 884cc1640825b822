"""DeepSpeed's own reading of a config, with every refusal said as a problem that names its key.

DeepSpeed's ``DeepSpeedConfig`` stops at the first thing it refuses and raises whatever its code met there: a
``DeepSpeedConfigError`` for a block DeepSpeed has removed, pydantic's ``ValidationError`` from a section's
model, an ``AssertionError`` for batch sizes, and ``ValueError``, ``KeyError``, ``TypeError`` or
``AttributeError`` for a value of the wrong kind. :func:`read` runs it with the launch's world size, takes the
offending key out after each refusal and runs it again, so that one pass finds every problem; each comes back
as one line that names the key and what to change. :mod:`course_utils.kernel.configs` adds the course's own checks.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import json
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_BATCH_FUNCTIONS = {"_configure_train_batch_size", "_set_batch_related_parameters", "_batch_assertion"}
_MAX_ROUNDS = 25        # one DeepSpeedConfig per refusal; a config has far fewer problems than this
# How configs name a note to their readers (JSON has no comments): "_comment", "comments", "description", …
_NOTE_WORDS = ("comment", "description", "note", "remark", "doc", "readme")


@dataclass
class Reading:
    """What DeepSpeed made of a config: its problems, and DeepSpeed's parse of the config without them."""
    problems: list[str] = field(default_factory=list)
    parsed: Any = None                               # DeepSpeedConfig, or None when DeepSpeed never got through
    read: set[str] = field(default_factory=set)      # the top-level keys DeepSpeed asked for
    dropped: list[str] = field(default_factory=list)  # dotted paths taken out to read the rest
    config: dict = field(default_factory=dict)       # the config DeepSpeed finally read (without dropped keys)


class _RecordingDict(dict):
    """A dict that remembers which keys were asked for, in order: the keys DeepSpeed actually reads."""

    def __init__(self, *args: Any, reads: list | None = None):
        super().__init__(*args)
        self.reads = [] if reads is None else reads

    def __copy__(self) -> "_RecordingDict":      # DeepSpeedConfig reads a copy.copy of the dict it is given
        return _RecordingDict(self, reads=self.reads)

    def get(self, key: Any, default: Any = None) -> Any:
        self.reads.append(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.reads.append(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.reads.append(key)
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
def world_of(world_size: int) -> Iterator[None]:
    """DeepSpeedConfig sees ``world_size`` ranks (it asks ``deepspeed.runtime.config.dist``)."""
    import deepspeed.runtime.config as ds_config
    real = ds_config.dist
    ds_config.dist = _World(world_size)
    try:
        yield
    finally:
        ds_config.dist = real


def is_note(key: Any) -> bool:
    """Whether a config key is a note to its readers rather than a setting: a name starting with "_" (the usual
    mark of a JSON key no program reads) or one of the words configs use for notes ("_comment", "description").

    DeepSpeed ignores such a key at the top level like any key it has no option for (``DeepSpeedConfig`` asks for
    the keys it knows and never looks at the rest), but refuses it inside one of its sections, whose pydantic models
    forbid unknown keys (``DeepSpeedConfigModel.model_config``, ``extra="forbid"``, in
    ``deepspeed/runtime/config_utils.py``, about line 110). A note is no typo, however close its name is to an
    option ("comment" and the ``comet`` monitor), so it gets no spelling suggestion."""
    name = str(key).lower()
    return name.startswith("_") or name.startswith(_NOTE_WORDS)


def removed_keys() -> dict[str, str]:
    """DeepSpeed's own list of the config keys it has removed and refuses, as dotted paths, with its message."""
    import deepspeed.runtime.config as ds_config
    top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})
    return {**top, **{f"zero_optimization.{k}": v for k, v in zero.items()}}


def read(cfg: dict, world_size: int) -> Reading:
    """Every problem DeepSpeed's ``DeepSpeedConfig`` finds in ``cfg`` for ``world_size`` ranks."""
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    out = Reading(config=copy.deepcopy(cfg))
    for path, message in removed_keys().items():
        if _resolves(out.config, path.split(".")):
            out.problems.append(f"{path}: DeepSpeed {deepspeed.__version__} refuses this key, whose feature it has "
                                f"removed (\"{message.strip()}\"). Remove {path} from the config.")
            _drop(out.config, path.split("."), out)
    for _ in range(_MAX_ROUNDS):
        recording = _RecordingDict(out.config)
        try:
            with world_of(world_size):
                out.parsed = DeepSpeedConfig(recording)
            out.read = {k for k in recording.reads if isinstance(k, str)}
            return out
        except ValidationError as e:
            found = _pydantic_problems(e, out.config, _last_read(recording, out.config))
        except Exception as e:          # whatever DeepSpeed's code raised on this config
            found = _exception_problems(e, out.config, _last_read(recording, out.config), world_size)
        out.problems += [text for _, text in found]
        if not any([_drop(out.config, path, out) for paths, _ in found for path in paths]):
            return out                  # no key to take out: DeepSpeed cannot read further
    out.problems.append("DeepSpeed refused more than this; fix the problems above and check again.")
    return out


def _last_read(recording: _RecordingDict, cfg: dict) -> str | None:
    """The top-level key DeepSpeed read last before it failed (among those the config has)."""
    return next((k for k in reversed(recording.reads) if isinstance(k, str) and k in cfg), None)


def _resolves(cfg: Any, path: list) -> bool:
    node = cfg
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and -len(node) <= part < len(node):
            node = node[part]
        else:
            return False
    return True


def _drop(cfg: dict, path: list, out: Reading) -> bool:
    """Take ``path`` out of ``cfg`` so DeepSpeed can read the rest; batch sizes become one sample per rank."""
    if path == ["<batch>"]:
        if all(cfg.get(k) == (1 if k == "train_micro_batch_size_per_gpu" else None) for k in BATCH_KEYS):
            return False
        out.dropped += [k for k in BATCH_KEYS if cfg.pop(k, None) is not None]
        cfg["train_micro_batch_size_per_gpu"] = 1
        return True
    if not path:                        # a whole-config error (a model validator's): no key to take out
        return False
    if not _resolves(cfg, path):
        path = path[:1]                 # a field missing from a section: take the section out
        if not _resolves(cfg, path):
            return False
    node = cfg
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    out.dropped.append(".".join(str(p) for p in path))
    return True


# --- pydantic: DeepSpeed's section models ---

def _pydantic_problems(e: Any, cfg: dict, last: str | None) -> list[tuple[list[list], str]]:
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    model = next((c for c in _subclasses(DeepSpeedConfigModel) if c.__name__ == e.title), None)
    found = []
    for err in e.errors():
        # a model validator's error has no location: it is about the section DeepSpeed was reading
        path = [last] if not err["loc"] and last else _locate(cfg, list(err["loc"]), last)
        found.append(([path], f"{'.'.join(str(p) for p in path)}: {_problem(err, _fields_at(model, list(err['loc'])))}"))
    return found


def _locate(cfg: dict, loc: list, last: str | None) -> list:
    """Where a pydantic error points, as a path from the top of the config: models are built from one section
    (the key DeepSpeed read last) or from the top-level dict itself."""
    candidates = [loc] + ([[last] + loc] if last else []) + [[s] + loc for s, v in cfg.items() if isinstance(v, dict)]
    found = next((c for c in candidates if _resolves(cfg, c)), None)
    if found is None and last is not None and isinstance(cfg.get(last), dict) and loc and loc[0] != last:
        found = [last] + loc
    return found or loc


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _fields_at(model: type | None, loc: list) -> list[str]:
    """Field names and aliases of the (nested) model that holds ``loc``'s last part."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    for part in loc[:-1]:
        info = None if model is None else next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        inner = [] if info is None else [info.annotation, *getattr(info.annotation, "__args__", ())]
        model = next((t for t in inner if isinstance(t, type) and issubclass(t, DeepSpeedConfigModel)), None)
    return [] if model is None else [n for name, f in model.model_fields.items() for n in (name, f.alias) if n]


def _problem(err: dict, fields: list[str]) -> str:
    """One pydantic error of DeepSpeed's config model, said plainly.

    Pydantic's own wording is clumsy for configs: an enum error lists DeepSpeed's aliases
    ("0, 1, 2, 3 or 3" for the stage, whose enum has ``max_stage = 3``), and an unknown key reads
    "Extra inputs are not permitted". A spelling suggestion is offered only for an unknown key that is no note
    (:func:`is_note`).
    """
    if not err["loc"]:                  # a model validator's error: its message is the whole of it
        return re.sub(r"^(Value error|Assertion failed), ", "", err["msg"])
    given = json.dumps(err.get("input"), default=str)
    if err["type"] == "extra_forbidden":
        if is_note(err["loc"][-1]):
            return ("DeepSpeed refuses any key this section has no option for, notes included; move the note to the "
                    "top level of the config, where DeepSpeed ignores it")
        close = difflib.get_close_matches(str(err["loc"][-1]), fields, n=1)
        if close:
            return f"DeepSpeed has no such option; did you mean {close[0]!r}?"
        options = sorted(set(fields))
        return ("DeepSpeed has no such option" + (f" (options here: {', '.join(options)})" if len(options) <= 12
                                                  else f" ({len(options)} options here, none named like it)")
                + "; remove it")
    if err["type"] == "enum":
        choices = list(dict.fromkeys(c.strip() for c in re.split(r",| or ", err["ctx"]["expected"]) if c.strip()))
        return f"{given} is not allowed; use one of {', '.join(choices)}"
    if err["type"] == "missing":
        return "DeepSpeed needs this setting here; add it"
    return f"{given} is not allowed: {err['msg'][0].lower()}{err['msg'][1:]}"


# --- everything else DeepSpeed raises ---

def _batch_hint(world_size: int, cfg: dict | None = None) -> str:
    """How DeepSpeed relates the three batch sizes; with ``sequence_parallel_size`` its world size is the
    number of data-parallel ranks (``DeepSpeedConfig.__init__`` divides by it)."""
    sp = (cfg or {}).get("sequence_parallel_size")
    ranks = (f"{world_size} ranks / sequence_parallel_size {sp} = {world_size / sp:g} here"
             if isinstance(sp, (int, float)) and not isinstance(sp, bool) and sp else f"{world_size} here")
    return (f" Batch sizes must satisfy train_batch_size = train_micro_batch_size_per_gpu × "
            f"gradient_accumulation_steps × world_size ({ranks}); give any two and DeepSpeed derives the third.")


def _exception_problems(e: Exception, cfg: dict, last: str | None, world_size: int) -> list[tuple[list[list], str]]:
    """Which keys an exception DeepSpeed raised is about: batch sizes (where it was raised, or what it names),
    the keys its message names, else the key DeepSpeed read last before it failed (DeepSpeed reads a key, then
    uses its value at once)."""
    said = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    functions = {frame.f_code.co_name for frame, _ in traceback.walk_tb(e.__traceback__)}
    if functions & _BATCH_FUNCTIONS or any(k in str(e) for k in BATCH_KEYS):
        keys = [k for k in BATCH_KEYS if k in cfg] or ["train_micro_batch_size_per_gpu"]
        return [([["<batch>"]], f"{', '.join(keys)}: DeepSpeed refuses the batch sizes (world size {world_size}): "
                              f"{said}.{_batch_hint(world_size, cfg)}")]
    named = _named_paths(cfg, str(e)) or ([[last]] if last is not None else [])
    if not named:
        return [([], f"DeepSpeed refuses the config ({said}); its message names no key of this config.")]
    keys = ", ".join(".".join(str(p) for p in path) for path in named)
    them = "it" if len(named) == 1 else "them"
    return [(named, f"{keys}: DeepSpeed refuses {them} ({said}). Change {keys} as the message says, or remove {them}.")]


def _named_paths(cfg: dict, message: str) -> list[list]:
    """The config paths a message names: a top-level key, a key with an underscore, or a plain key word
    (``enabled``) whose section the message names too; the deepest of them."""
    def said(word: str) -> bool:
        return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", message, re.IGNORECASE) is not None

    def walk(node: Any, prefix: list) -> Iterator[list]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield prefix + [key]
                yield from walk(value, prefix + [key])

    named = [p for p in walk(cfg, []) if isinstance(p[-1], str) and said(p[-1])
             and (len(p) == 1 or "_" in p[-1] or any(said(str(a)) for a in p[:-1]))]
    return [p for p in named if not any(len(q) > len(p) and q[:len(p)] == p for q in named)]
