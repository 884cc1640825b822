"""The config reference: every DeepSpeed config key the course uses, read from DeepSpeed itself.

``python -m course_utils.tooling.config_reference`` writes ``notebooks/appendix/config_reference.md``. Nothing in it
is typed by hand: the keys come from the course's configs (``configs/*.json``) and from the notebooks and
scripts that build configs in code; each key's default and description come from the installed DeepSpeed
(its pydantic config models and their field docstrings, its ``*_DEFAULT`` constants, the signatures of its
schedulers and optimizers); where the course uses a key is found in the notebooks (notebook and section).
So the reference cannot drift from the pinned version, and ``--check`` (a test) fails when it has.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.common import paths
from course_utils.tooling.nbtools import notebooks

REFERENCE = paths.NOTEBOOKS / "appendix" / "config_reference.md"
DEEPSPEED_DOCS = "https://www.deepspeed.ai/docs/config-json/"
HF_GUIDE = "https://huggingface.co/docs/transformers/deepspeed"

# Where DeepSpeed defines each part of its config: a pydantic model ("module:Class") or a module of
# NAME = "key" / NAME_DEFAULT = value constants. Nested sections are dotted paths.
MODELS = {
    "zero_optimization": "deepspeed.runtime.zero.config:DeepSpeedZeroConfig",
    "zero_optimization.offload_optimizer": "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadOptimizerConfig",
    "zero_optimization.offload_param": "deepspeed.runtime.zero.offload_config:DeepSpeedZeroOffloadParamConfig",
    "bf16": "deepspeed.runtime.precision_config:DeepSpeedBF16Config",
    "fp16": "deepspeed.runtime.precision_config:DeepSpeedFP16Config",
    "comms_logger": "deepspeed.comm.config:CommsLoggerConfig",
    "csv_monitor": "deepspeed.monitor.config:CSVConfig",
    "tensorboard": "deepspeed.monitor.config:TensorBoardConfig",
    "wandb": "deepspeed.monitor.config:WandbConfig",
}
CONSTANTS = {
    "": "deepspeed.runtime.constants",
    "flops_profiler": "deepspeed.profiling.constants",
    "activation_checkpointing": "deepspeed.runtime.activation_checkpointing.config",
    "aio": "deepspeed.runtime.swap_tensor.constants",
}
# optimizer.params and scheduler.params are the keyword arguments of the class the "type" names.
PARAM_CLASSES = {
    "optimizer": {"adam": "deepspeed.ops.adam:FusedAdam", "adamw": "deepspeed.ops.adam:FusedAdam",
                  "lamb": "deepspeed.ops.lamb:FusedLamb"},
    "scheduler": {name.lower(): f"deepspeed.runtime.lr_schedules:{name}"
                  for name in ("LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")},
}
_GENERIC = {"enabled", "type", "params", "device", "stage", "lr", "auto", "profile", "output_path", "job_name"}


@dataclass
class Key:
    path: str                 # dotted, e.g. "zero_optimization.offload_optimizer.device"
    default: str              # as DeepSpeed's code sets it, JSON-like
    defined_in: str           # where DeepSpeed defines it
    doc: str = ""             # the first sentence of DeepSpeed's own docstring, when it has one
    configs: tuple[str, ...] = ()
    where: tuple[str, ...] = ()      # "NN · section" of the notebooks that name it


def _load(spec: str):
    module, _, name = spec.partition(":")
    m = importlib.import_module(module)
    return getattr(m, name) if name else m


def _field_docs(cls) -> dict[str, str]:
    """Field name → first sentence of the string literal after it in the class body (DeepSpeed's style)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                text = " ".join(after.value.value.split())
                docs[node.target.id] = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return docs


def _shown(value) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return str(getattr(value, "value", value))


def _model_key(section: str, name: str) -> Key | None:
    cls = _load(MODELS[section])
    for field_name, info in cls.model_fields.items():
        if name in (field_name, info.alias):
            default = info.default_factory() if info.default_factory is not None else info.default
            if hasattr(default, "model_dump"):
                default = "{…}"
            return Key(f"{section}.{name}", _shown(default), f"`{cls.__module__}.{cls.__name__}.{field_name}`",
                       _field_docs(cls).get(field_name, ""))
    return None


def _constant_key(section: str, name: str) -> Key | None:
    module = _load(CONSTANTS[section])
    for attr, value in vars(module).items():
        if value == name and isinstance(value, str) and hasattr(module, f"{attr}_DEFAULT"):
            default = getattr(module, f"{attr}_DEFAULT")
            return Key(f"{section}.{name}".lstrip("."), _shown(default), f"`{module.__name__}.{attr}_DEFAULT`",
                       _constant_doc(module, attr))
    return None


_BOILERPLATE = re.compile(r"Users can configure in ds_config\.json as below example:?|By default, this feature is not "
                          r"enabled\.?|Example:?$")


def _constant_doc(module, attr: str) -> str:
    """The comment DeepSpeed's source puts above the block that defines ``attr`` (its style for config constants:
    ``# Gradient accumulation feature. ...`` above a ``*_FORMAT`` example and the constants), first sentence; ""
    where there is none. Walks up from ``attr = "key"`` over the block's other assignments and its example string."""
    try:
        lines = inspect.getsource(module).splitlines()
    except (OSError, TypeError):
        return ""
    at = next((i for i, line in enumerate(lines) if re.match(rf"{attr}\s*=", line)), None)
    if at is None:
        return ""
    comment: list[str] = []
    i, in_string, others = at - 1, False, False     # others: the comment heads a block of other keys' constants too
    while i >= 0 and at - i < 40:
        line = lines[i].strip()
        if line.count("'''") % 2 or line.count('"""') % 2:
            in_string = not in_string
        elif in_string or not line or (m := re.match(r"([A-Z0-9_]+)\s*=", line)):
            if comment:
                break
            if not in_string and line and not m[1].startswith(attr):
                others = True
        elif line.startswith("#"):
            text = line.strip("#").strip()
            if re.match(r"Copyright|SPDX|DeepSpeed Team$", text):
                break
            if text and not set(text) <= {"#", "-", "="}:
                comment.insert(0, text)
            elif comment:
                break
        else:
            break
        i -= 1
    text = _BOILERPLATE.sub("", " ".join(comment)).strip()
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0] if text else ""
    return f"(its section) {first}" if first and others else first


def _param_key(section: str, type_name: str, name: str) -> Key | None:
    spec = PARAM_CLASSES[section].get(type_name.lower())
    if spec is None:
        return None
    cls = _load(spec)
    parameter = inspect.signature(cls.__init__).parameters.get(name)
    if parameter is None:
        return None
    default = "(required)" if parameter.default is inspect.Parameter.empty else _shown(parameter.default)
    return Key(f"{section}.params.{name}", default, f"`{cls.__module__}.{cls.__name__}` ({type_name})")


def describe(path: str, config: dict | None = None) -> Key | None:
    """DeepSpeed's definition of one dotted key (``config``: the config it came from, for params' type)."""
    parts = path.split(".")
    if parts[0] in PARAM_CLASSES and len(parts) == 3 and parts[1] == "params":
        type_name = (config or {}).get(parts[0], {}).get("type", "")
        return _param_key(parts[0], type_name, parts[2]) or Key(path, "(per type)", f"the {parts[0]} class `{type_name}`")
    if parts[0] in PARAM_CLASSES and parts[1:] in ([], ["type"], ["params"]):
        if len(parts) == 1:
            return _constant_key("", path) or Key(path, "null", "`deepspeed.runtime.constants` (a section)")
        return Key(path, "null", "`deepspeed.runtime.config`")
    for depth in range(len(parts) - 1, -1, -1):
        section, rest = ".".join(parts[:depth]), parts[depth:]
        if len(rest) != 1:
            continue
        if section in MODELS:
            return _model_key(section, rest[0])
        if section in CONSTANTS:
            found = _constant_key(section, rest[0])
            if found:
                return found
    if path in MODELS:
        return Key(path, "{…}", f"`{MODELS[path].replace(':', '.')}`")
    if path in CONSTANTS or path in PARAM_CLASSES:
        return Key(path, "null" if path in PARAM_CLASSES else "{…}",
                   f"`{CONSTANTS.get(path, 'deepspeed.runtime.constants')}`" + (" (a section)" if path in CONSTANTS else ""))
    return None


def known_names() -> dict[str, str]:
    """Every key name DeepSpeed defines that is specific enough to find in code → its dotted path."""
    found: dict[str, list[str]] = {}
    for section, spec in MODELS.items():
        for field_name, info in _load(spec).model_fields.items():
            for name in {field_name, info.alias} - {None}:
                found.setdefault(name, []).append(f"{section}.{name}")
    for section, spec in CONSTANTS.items():
        module = _load(spec)
        for attr, value in vars(module).items():
            if isinstance(value, str) and hasattr(module, f"{attr}_DEFAULT") and not attr.endswith("_DEFAULT"):
                found.setdefault(value, []).append(f"{section}.{value}".lstrip("."))
    for section in [*MODELS, *CONSTANTS, *PARAM_CLASSES]:
        found.setdefault(section, []).append(section) if section else None
    return {name: where[0] for name, where in found.items()
            if len(set(where)) == 1 and "_" in name and name not in _GENERIC}


def code_keys() -> set[str]:
    """Dotted keys the notebooks, scripts and rank helpers set in code ("name": or name=...) rather than in configs/."""
    names = known_names()
    sources = [c.source for nb in notebooks() for c in nbformat.read(str(nb), as_version=4).cells if c.cell_type == "code"]
    sources += [p.read_text() for p in [*sorted(paths.SCRIPTS.glob("*.py")), *sorted((paths.ROOT / "course_utils" / "rank").glob("*.py")),
                                            *sorted((paths.ROOT / "course_utils" / "common").rglob("*.py"))]]
    text = "\n".join(sources)
    return {path for name, path in names.items() if re.search(rf"[\"']{re.escape(name)}[\"']\s*[:\]]", text)}


def config_keys() -> dict[str, dict]:
    """Every dotted key (sections and leaves) of the course's configs → the first config that has it."""
    found: dict[str, dict] = {}

    def walk(node, prefix: str, config: dict, name: str):
        for key, value in node.items():
            path = f"{prefix}{key}"
            found.setdefault(path, {"config": config, "names": []})["names"].append(name)
            if isinstance(value, dict):
                walk(value, f"{path}.", config, name)

    for file in sorted(paths.CONFIGS.glob("*.json")):
        config = json.loads(file.read_text())
        walk(config, "", config, file.name)
    for path in code_keys():
        found.setdefault(path, {"config": {}, "names": []})["names"].append("(in code)")
    return found


def _sections(nb_path: Path) -> list[tuple[str, str]]:
    """(section heading, cell text) for each cell of a notebook."""
    heading, out = "top", []
    for cell in nbformat.read(str(nb_path), as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("## "):
                    heading = line[3:].strip()
        out.append((heading, cell.source))
    return out


def where_named(names: set[str]) -> dict[str, list[str]]:
    """Key name → the "NN · section" places of the notebooks whose cells name it in quotes or backticks."""
    places: dict[str, list[str]] = {n: [] for n in names}
    for nb_path in notebooks():
        for heading, text in _sections(nb_path):
            for n in names:
                if re.search(rf"[\"'`]{re.escape(n)}[\"'`:]", text):
                    place = f"{nb_path.stem[:2]} · {heading}"
                    if place not in places[n]:
                        places[n].append(place)
    return places


def reference_keys() -> list[Key]:
    """The course's keys with DeepSpeed's definition and the places the notebooks use them."""
    used = config_keys()
    keys = []
    for path, info in used.items():
        key = describe(path, info["config"]) or Key(path, "?", "not found in DeepSpeed's config code")
        key.configs = tuple(dict.fromkeys(info["names"]))
        keys.append(key)
    leaves = {k.path.rsplit(".", 1)[-1] for k in keys} - _GENERIC
    places = where_named(leaves)
    for k in keys:
        k.where = tuple(places.get(k.path.rsplit(".", 1)[-1], ()))
    return sorted(keys, key=lambda k: k.path)


def render(keys: list[Key]) -> str:
    lines = ["# Config reference: the DeepSpeed keys this course uses", "",
             "Generated by `python -m course_utils.tooling.config_reference` from the installed DeepSpeed "
             f"({_load('deepspeed').__version__}): each key's default and description are DeepSpeed's own, read from its "
             "config models and constants; **used in** lists the course configs (`configs/`) that set it; **taught in** "
             "the notebook sections that name it, where its effect is measured; (in code): a notebook or script sets it in a config it builds. Do not edit by hand.", "",
             f"The full list of keys: DeepSpeed's [config documentation]({DEEPSPEED_DOCS}). How the Hugging Face "
             f"Trainer fills `\"auto\"` values and which arguments it reads: the [HF DeepSpeed guide]({HF_GUIDE}) "
             "and notebook 08.", "",
             "| key | default (pinned DeepSpeed) | what DeepSpeed says | used in | taught in |", "|---|---|---|---|---|"]
    for k in keys:
        doc = k.doc.replace("|", "\\|")
        used = ", ".join(k.configs) if len(k.configs) <= 4 else f"{len(k.configs)} of the course's configs"
        defined = doc or ("no description in DeepSpeed's source" if k.defined_in.endswith("_DEFAULT`")
                          else k.defined_in)
        lines.append(f"| `{k.path}` | `{k.default}` | {defined} | {used} | "
                     f"{'; '.join(k.where) or '—'} |")
    return "\n".join(lines) + "\n"


def missing(reference: str, keys: list[str]) -> list[str]:
    """The keys a reference text has no row for."""
    return [k for k in keys if f"| `{k}` |" not in reference]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether the committed reference is current")
    a = parser.parse_args(argv)
    from course_utils.kernel import hardware
    hardware.detect()     # before DeepSpeed is imported: on a CPU machine no "Setting accelerator to CPU" warning
    text = render(reference_keys())
    if a.check:
        current = REFERENCE.exists() and REFERENCE.read_text() == text
        print(f"{paths.relative(REFERENCE)} is " + ("current" if current else
              "out of date: run `python -m course_utils.tooling.config_reference`"))
        return 0 if current else 1
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(text)
    print(f"wrote {paths.relative(REFERENCE)} ({text.count(chr(10)) - 8} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
