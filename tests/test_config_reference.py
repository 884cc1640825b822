"""The config reference (notebooks/appendix/config_reference.md) is generated from DeepSpeed and current."""
import json

import pytest

from course_utils.tooling import config_reference as ref


@pytest.fixture(scope="module")
def rows():
    return ref.reference_keys()


def test_every_key_of_the_course_configs_has_a_row_with_deepspeeds_default(rows):
    text = ref.REFERENCE.read_text()
    keys = list(ref.config_keys())
    assert ref.missing(text, keys) == [], "run `python -m course_utils.tooling.config_reference`"
    rows = {k.path: k for k in rows}
    assert all(k.default != "?" for k in rows.values()), [p for p, k in rows.items() if k.default == "?"]
    # defaults are DeepSpeed's own, not typed in: spot-check against DeepSpeed's config model
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    assert rows["zero_optimization.stage3_max_live_parameters"].default == json.dumps(
        DeepSpeedZeroConfig().max_live_parameters)


def test_the_committed_reference_is_what_the_generator_writes_now(rows):
    assert ref.REFERENCE.read_text() == ref.render(rows), (
        "the reference drifted from the configs, notebooks or DeepSpeed: run `python -m course_utils.tooling.config_reference`")


def test_a_key_missing_from_the_reference_is_reported(tmp_path, monkeypatch):
    """The check can fail: a config with a key the reference has no row for."""
    (tmp_path / "extra.json").write_text(json.dumps({"zero_optimization": {"round_robin_gradients": True}}))
    monkeypatch.setattr(ref.paths, "CONFIGS", tmp_path)
    keys = list(ref.config_keys())
    assert "zero_optimization.round_robin_gradients" in ref.missing(ref.REFERENCE.read_text(), keys)
