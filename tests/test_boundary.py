"""The rooms of course_utils and what each may import: the rank side (course_utils.rank, scripts/) never imports
the notebook kernel's side or the tooling, course_utils.common imports no other room and nothing heavy, the kernel
never imports the tooling, and ``import course_utils`` alone is cheap and changes nothing."""
import ast
import json
import os
import subprocess
import sys

import pytest

from course_utils.common import paths

PACKAGE = paths.ROOT / "course_utils"
ROOMS = {"rank", "common", "kernel", "tooling"}
RANK_MODULES = sorted(f"course_utils.rank.{p.stem}" for p in (PACKAGE / "rank").glob("*.py") if p.stem != "__init__")
COMMON_MODULES = sorted(f"course_utils.common.{p.stem}" for p in (PACKAGE / "common").glob("*.py") if p.stem != "__init__")
NOTEBOOK_SIDE = ["course_utils.kernel", "course_utils.tooling"]
NOTEBOOK_LIBRARIES = ["pandas", "matplotlib", "ipywidgets"]
HEAVY = ["torch", "deepspeed", "transformers", "numpy"]


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in NOTEBOOK_SIDE + NOTEBOOK_LIBRARIES)


def _python(code: str, env: dict | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=paths.ROOT, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_rooms_are_what_this_test_thinks():
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} == ROOMS
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"], "every module lives in one of the rooms"
    assert {"course_utils.common.record", "course_utils.common.run_folder", "course_utils.common.paths"} <= set(COMMON_MODULES)
    assert "course_utils.rank.scaffolding" in RANK_MODULES


def test_common_modules_import_no_other_room_and_nothing_heavy():
    loaded = json.loads(_python("import importlib, json, sys\n"
                                f"for m in {COMMON_MODULES!r}: importlib.import_module(m)\n"
                                "print(json.dumps(sorted(sys.modules)))"))
    assert [m for m in loaded if m.startswith("course_utils.") and not m.startswith("course_utils.common")] == []
    assert [m for m in loaded if m.split(".")[0] in HEAVY + NOTEBOOK_LIBRARIES] == []


@pytest.mark.parametrize("path", sorted((PACKAGE / "kernel").rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_kernel_never_imports_the_tooling_or_a_script(path):
    bad = [f"line {line}: {name}" for line, name in _imports(path)
           if name.startswith("course_utils.tooling") or name.startswith("scripts")]
    assert bad == [], f"{path.name} imports the tooling or a script: {bad}"


def test_rank_modules_import_no_notebook_side_module():
    """Import every rank-side module in a fresh interpreter, then look at everything that got imported."""
    loaded = json.loads(_python("import importlib, json, sys\n"
                                f"for m in {RANK_MODULES + COMMON_MODULES!r}: importlib.import_module(m)\n"
                                "print(json.dumps(sorted(sys.modules)))"))
    assert set(RANK_MODULES) <= set(loaded)
    assert [m for m in loaded if _forbidden(m)] == []


def _imports(path) -> list[tuple[int, str]]:
    """Every module an import statement in ``path`` names, at any depth (function-level imports too),
    with relative imports resolved inside course_utils."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(paths.ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "rank").rglob("*.py")) + sorted((PACKAGE / "common").glob("*.py"))
                         + sorted(paths.SCRIPTS.glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rank_side_source_never_imports_the_notebook_side(path):
    """The source of every rank module and script, including imports inside functions (which the
    import test above cannot see until they run)."""
    bad = [f"line {line}: {name}" for line, name in _imports(path) if _forbidden(name)]
    assert bad == [], f"{path.name} imports the notebook side: {bad}"


def test_import_course_utils_is_cheap_and_side_effect_free():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    result = json.loads(_python("import json, os, sys\nbefore = dict(os.environ)\nimport course_utils\n"
                                "print(json.dumps({'modules': sorted(sys.modules), 'env_changed': dict(os.environ) != before}))",
                                env=env))
    assert not result["env_changed"], "import course_utils must not set environment variables"
    heavy = [m for m in result["modules"] if m.split(".")[0] in ("torch", "deepspeed", "pandas", "transformers")]
    assert heavy == []
    assert [m for m in result["modules"] if m.startswith("course_utils.")] == []


def test_notebook_attributes_are_imported_on_first_use():
    out = _python("import sys, course_utils as cu\n"
                  "assert 'course_utils.kernel.checks' not in sys.modules\n"
                  "names = [cu.checks.check, cu.configs.validate, cu.paths.ROOT, cu.hardware.detect, cu.start, cu.Notebook,\n"
                  "         cu.launch.deepspeed]\n"
                  "print('ok', 'course_utils.kernel.checks' in sys.modules)")
    assert out.split() == ["ok", "True"]
    with pytest.raises(AttributeError):
        import course_utils
        course_utils.no_such_helper  # noqa: B018


@pytest.mark.parametrize("module", ["course_utils.rank", "course_utils.kernel.ops"])
def test_the_torch_extensions_default_reaches_ranks_and_the_op_build(module):
    """Ranks started from a terminal and the op build both look for DeepSpeed's ops in <venv>/torch_extensions."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    out = _python(f"import os, {module}\nprint(os.environ['TORCH_EXTENSIONS_DIR'])", env=env)
    assert out.strip() == str(paths.torch_extensions_dir())


def test_the_kernel_and_the_notebooks_import_no_script():
    """What the kernel needs of a script (its records, its command line) lives in course_utils/common/records/:
    no kernel module or notebook loads a file of scripts/ as a module (by file location, runpy or a loader)."""
    places = [*(PACKAGE / "kernel").rglob("*.py"), *paths.NOTEBOOKS.glob("*.ipynb")]
    loads = ("spec_from_file_location", "runpy", "scripts.load(", "load_script(", "SourceFileLoader")
    bad = [f"{p.relative_to(paths.ROOT)}: {word}" for p in places for word in loads if word in p.read_text()]
    assert bad == []
