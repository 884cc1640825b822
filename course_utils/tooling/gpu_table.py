"""What each notebook does on 1, 2 and 8 GPUs, worked out from its own launch cells for a described machine.

Every ``launch.deepspeed(...)`` call of a notebook is read from its code (``ast``), and every call of a view's
function marked as making one launch (``@launch.launches(procs=1)``: notebook 16's ``bigger.try_sizes``), its
``procs``, ``min_ranks``, ``nodes`` and ``env`` evaluated with the notebook's own assignments (``PROCS = None``, ``procs = PROCS or
nb.hardware.default_procs``, ...) on a machine described as data (:func:`course_utils.kernel.hardware.describe`), and
placed by the runner's own rule (:func:`course_utils.kernel.hardware.placement`; an ``env`` with ``DS_ACCELERATOR=cpu``
keeps CPU ranks anywhere). The README's GPU table and the "On GPUs" line of each notebook's opening box are made
from it (``python -m course_utils.tooling.tables --write``); tests/test_manifest.py fails when either drifts.
"""
from __future__ import annotations

import ast
import importlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import nbformat

from course_utils.common import devices, paths
from course_utils.kernel import hardware
from course_utils.kernel.launch.options import LAUNCHES_ATTRIBUTE
from course_utils.rank.models import SIZE_ENV
from course_utils.tooling.nbtools import opening_box_drift

MACHINES = (1, 2, 8)
BOX_PREFIX = "> **On GPUs**"


def _evaluate(node: ast.expr, names: dict):
    """The value of one expression of a notebook's code, its names looked up in ``names``."""
    return eval(compile(ast.Expression(node), "<notebook>", "eval"), {}, names)


class _Names(dict):
    """A namespace that evaluates a notebook's own assignment of a name the first time it is asked for."""

    def __init__(self, assignments: dict[str, ast.expr], base: dict):
        super().__init__(base)
        self.assignments = assignments

    def __missing__(self, name: str):
        if name not in self.assignments:
            raise KeyError(name)
        value = _evaluate(self.assignments[name], self)
        self[name] = value
        return value


def _imported_modules(tree: ast.Module) -> dict[str, str]:
    """name → module of a cell's ``from course_utils... import module`` and ``import course_utils... as name``."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils"):
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("course_utils.") and alias.asname:
                    out[alias.asname] = alias.name
    return out


def declared_launch(call: ast.Call, modules: dict[str, str]) -> dict | None:
    """The placement a view function declares (:func:`course_utils.kernel.launch.launches`) when ``call`` calls one
    (``bigger.try_sizes(...)``, its module imported in the notebook); None for any other call."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules):
        return None
    try:
        target = getattr(importlib.import_module(modules[func.value.id]), func.attr, None)
    except ImportError:           # a name that is not a module (a function imported from one)
        return None
    return getattr(target, LAUNCHES_ATTRIBUTE, None)


def _launch_calls(notebook: Path) -> tuple[list[tuple[ast.Call, list, dict | None]], dict[str, ast.expr]]:
    """Each launch (a ``launch.deepspeed`` call, or a call of a function that declares one launch, with that
    placement) with the ``if`` tests around it (``(test, branch taken)``), and the assignments."""
    nb = nbformat.read(str(notebook), as_version=4)
    calls, assignments, modules = [], {}, {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:           # an IPython magic: such a cell launches nothing through the runner
            continue
        modules.update(_imported_modules(tree))
        conditions = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.If):
                for branch, body in ((True, node.body), (False, node.orelse)):
                    for inner in (n for part in body for n in ast.walk(part)):
                        conditions.setdefault(inner, []).append((node.test, branch))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assignments.setdefault(node.targets[0].id, node.value)
            if not isinstance(node, ast.Call):
                continue
            if (isinstance(node.func, ast.Attribute) and node.func.attr == "deepspeed"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "launch"):
                calls.append((node, conditions.get(node, []), None))
            elif (declared := declared_launch(node, modules)) is not None:
                calls.append((node, conditions.get(node, []), declared))
    return calls, assignments


def _runs(conditions: list, names: dict) -> bool:
    """Whether a launch under these ``if`` tests runs on the machine: a test that cannot be worked out from the
    notebook's own cells (an exercise's answer, say) counts as taken."""
    for test, branch in conditions:
        try:
            if bool(_evaluate(test, names)) != branch:
                return False
        except Exception:
            continue
    return True


def launches(notebook: Path, hw: hardware.Hardware, sized: bool = False) -> list[tuple]:
    """(``"GPU"`` or ``"CPU"``, ranks) of each launch of ``notebook`` on the machine ``hw``; with ``sized``, a third
    item: the GPT-2 size its ``env`` gives the ranks (``hardware.sized_env``), or ``""``."""
    calls, assignments = _launch_calls(notebook)
    told = SimpleNamespace(hardware=hw)
    course = SimpleNamespace(hardware=SimpleNamespace(detect=lambda: hw, placement=hardware.placement,
                                                      cpu_ranks_env=hardware.cpu_ranks_env, sized_env=hardware.sized_env))
    names = _Names(assignments, {"nb": told, "cu": course, "max": max, "min": min})
    out = []
    for call, conditions, declared in calls:
        if not _runs(conditions, names):
            continue
        given = dict(declared or {})
        for kw in call.keywords if declared is None else ():
            if kw.arg in ("procs", "min_ranks", "nodes", "env"):
                try:
                    given[kw.arg] = _evaluate(kw.value, names)
                except Exception as e:
                    raise ValueError(f"{notebook.name}, line {call.lineno} of its cell: cannot work out "
                                     f"{kw.arg}={ast.unparse(kw.value)} ({type(e).__name__}: {e})") from None
        nodes = int(given.get("nodes") or 1)
        place = hardware.placement(hw, given.get("procs"), given.get("min_ranks"), nodes)
        env = given.get("env") or {}
        cpu = place.cpu_on_gpu_machine or env.get(devices.ACCELERATOR_ENV) == "cpu"
        where = ("CPU" if cpu else "GPU", place.procs * nodes)
        out.append((*where, env.get(SIZE_ENV, "")) if sized else where)
    return out


def describe_row(found: list[tuple]) -> str:
    """``"1 launch on 1 GPU, 2 on 2 CPU ranks"``: how many launches run where (and, for launches sized for the GPU,
    on which GPT-2: ``"1 launch on 1 GPU (gpt2-medium)"``)."""
    if not found:
        return "no DeepSpeed launch uses a GPU (its Slurm cluster's ranks compute on the CPU)"
    parts = []
    for (where, ranks, *sized), n in sorted(Counter(found).items(), key=lambda item: (item[0][0] != "GPU", item[0][1:])):
        size = sized[0] if sized else ""
        unit = ("GPU" if ranks == 1 else "GPUs") if where == "GPU" else ("CPU rank" if ranks == 1 else "CPU ranks")
        unit += f" ({size})" if size else ""
        count = f"{n} launch{'es' if n > 1 else ''}" if not parts else str(n)
        parts.append(f"{count} on {ranks} {unit}")
    return ", ".join(parts)


def notebook_rows(notebook: Path) -> dict[int, str]:
    return {gpus: describe_row(launches(notebook, hardware.describe(gpus), sized=True)) for gpus in MACHINES}


def readme_gpu_table(notebooks: Path = paths.NOTEBOOKS) -> str:
    from course_utils.tooling import manifest

    entries = manifest.load()
    lines = ["| # | notebook | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in MACHINES) + " |",
             "|---|---|" + "---|" * len(MACHINES)]
    for nb in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        rows = notebook_rows(nb)
        lines.append(f"| {nb.stem[:2]} | {entries[nb.stem]['title']} | " + " | ".join(rows[g] for g in MACHINES) + " |")
    return "\n".join(lines)


def box_line(notebook: Path) -> str:
    """The "On GPUs" line of the notebook's opening box: its launches on 1, 2 and 8 GPUs."""
    rows = notebook_rows(notebook)
    return (f"{BOX_PREFIX} (nccl, one rank per GPU; a launch that needs more ranks than there are GPUs runs on CPU ranks "
            f"over gloo): " + "; ".join(f"with {g} GPU{'s' if g > 1 else ''}, {rows[g]}" for g in MACHINES) + ".  ")


def with_box_line(source: str, line: str) -> str:
    """The opening cell's ``source`` with its "On GPUs" line replaced, or added after the box's last line."""
    lines = source.split("\n")
    for i, old in enumerate(lines):
        if old.startswith(BOX_PREFIX):
            lines[i] = line
            return "\n".join(lines)
    last = max(i for i, old in enumerate(lines) if old.startswith("> "))
    if not lines[last].endswith("  "):
        lines[last] += "  "
    lines.insert(last + 1, line)
    return "\n".join(lines)


def box_drift(notebooks: Path = paths.NOTEBOOKS, write: bool = False) -> list[str]:
    """The notebooks whose opening box lacks the right "On GPUs" line (rewritten with ``write``)."""
    return opening_box_drift(box_line, with_box_line, notebooks, write)
