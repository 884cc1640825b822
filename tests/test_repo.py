"""Rules of the repository: stored notebooks are clean and follow the skeleton, pins agree."""
import re

import nbformat
import pytest

from course_utils import paths
from course_utils.nbtools import has_outputs, notebooks
from course_utils.student import BEGIN, END, strip_solutions

NOTEBOOKS = notebooks()


def pins(text: str) -> dict:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", text, re.M)}


def test_environment_yml_and_requirements_pin_the_same_versions():
    req = pins((paths.ROOT / "requirements.txt").read_text())
    env = pins((paths.ROOT / "environment.yml").read_text())
    assert req and req == env


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_setup_and_first_launch.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    assert not has_outputs(path), f"{path.name} holds outputs: python -m course_utils.nbtools strip {path}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_follows_the_skeleton(path):
    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "deepspeed-course"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    assert re.search(r"^SMOKE = False", params[0].source, re.M), "parameters define SMOKE = False"
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any(f'start("{path.stem}")' in s for s in code), "the notebook opens with cu.start(<its name>)"
    assert not any(re.search(r"^\s*!\s*deepspeed", s, re.M) for s in code), "launch through course_utils.launch"
    exercises = sum(s.count(BEGIN) for s in code)
    assert exercises >= 2, "at least two exercises"
    assert exercises == sum(s.count(END) for s in code)


def test_strip_solutions_keeps_indentation_and_removes_the_answer():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\nprint(f)"
    assert strip_solutions(src) == "def f(x):\n    raise NotImplementedError()\n\nprint(f)"
    with pytest.raises(ValueError):
        strip_solutions("### BEGIN SOLUTION\nx = 1\n")
