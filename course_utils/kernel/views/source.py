"""The lines of an installed library that decide what a notebook says it does (every topic quotes them)."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

from course_utils.common import paths


def show_source(package: str, relpath: str, pattern: str, after: int = 2, limit: int = 1) -> None:
    """Print the lines of the installed ``package``'s file ``relpath`` that contain ``pattern`` (plus ``after``
    lines each), with line numbers, e.g. ``show_source("accelerate", "utils/deepspeed.py", "optimizer_class =")``:
    the evidence for what the notebook says a library does. The package is found, not imported."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"{package!r} is not an installed package")
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    lines = path.read_text().splitlines()
    hits = [i for i, line in enumerate(lines) if pattern in line][:limit]
    if not hits:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        raise LookupError(f"{pattern!r} not found in {path}: the installed {package} {version} differs from the "
                          f"version this notebook was written for")
    for i in hits:
        print(f"{package}/{relpath}:{i + 1}")
        for j in range(i, min(i + 1 + after, len(lines))):
            print(f"  {j + 1:5d} | {lines[j]}")


def show_script(script: str, *anchors: str, after: int = 0) -> None:
    """Print the lines of ``scripts/<script>`` that hold each of ``anchors`` (plus ``after`` lines each), numbered, in
    file order, "⋮" between lines that are not adjacent: the DeepSpeed calls of the script the ranks just ran, quoted
    from the file itself, e.g. ``show_script("02_train.py", "deepspeed.initialize(", "engine.backward(", "engine.step(")``.
    An anchor the file does not hold is an error (the page must not quote code that no longer runs). A ``script`` with
    a ``/`` is a path from the repository's root: the course's own rank-side code a script calls
    (``show_script("course_utils/rank/parallel.py", "deepspeed.initialize(")``)."""
    path = paths.ROOT / script if "/" in script else paths.SCRIPTS / script
    lines = path.read_text().splitlines()
    shown: set[int] = set()
    for anchor in anchors:
        hits = [i for i, line in enumerate(lines) if anchor in line]
        if not hits:
            raise LookupError(f"{anchor!r} is not in {paths.relative(path)}: the script changed; quote what it runs now")
        shown.update(range(hits[0], min(hits[0] + 1 + after, len(lines))))
    print(f"{paths.relative(path)}:")
    previous = None
    for i in sorted(shown):
        if previous is not None and i != previous + 1:
            print("        ⋮")
        print(f"  {i + 1:5d} | {lines[i]}")
        previous = i


def show_script_function(script: str, name: str) -> None:
    """Print the function ``name`` of ``scripts/<script>`` as written there, e.g.
    ``show_script_function("11_hang.py", "log_metrics")``: read with ``ast``, not imported (the kernel imports no
    script)."""
    path = paths.SCRIPTS / script
    text = path.read_text()
    functions = (n for n in ast.parse(text).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    node = next((n for n in functions if n.name == name), None)
    if node is None:
        raise LookupError(f"no function {name!r} in {paths.relative(path)}")
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    lines = text.splitlines()
    print(f"{paths.relative(path)}:")
    for number in range(first, node.end_lineno + 1):
        print(f"  {number:5d} | {lines[number - 1]}")
