"""Notebook 07 executed with papermill; optimizer classes, LR curves and the HF/DS matrix asserted."""
import pytest

from conftest import run_notebook
from course_utils import hardware

NAME = "07_optimizers_and_schedulers"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    assert set(m["combo_matrix"]) == {f"{o}_opt+{s}_sched{x}" for o in ("hf", "ds") for s in ("hf", "ds")
                                      for x in ("", "+offload")}
    assert all(v == "ok" for v in m["combo_matrix"].values()), m["combo_matrix"]
    assert m["matrix_world_size"] == [hardware.detect().default_procs], "the Trainer must see every rank"
    classes = m["combo_optimizer_classes"]
    assert classes["hf_opt+hf_sched"] == "AdamW" and classes["ds_opt+ds_sched"] == "FusedAdam"
    assert {classes[k] for k in classes if k.endswith("+offload")} == {"DeepSpeedCPUAdam"}
    assert m["optimizer_classes"]["Adam + offload"] == "DeepSpeedCPUAdam"
    assert m["optimizer_outcomes"]["OneBitAdam"] == "AssertionError", "0.19.8 no longer ships OneBitAdam"
    if not hardware.detect().is_gpu:
        assert m["optimizer_outcomes"]["Lamb"] == "ValueError", "FusedLamb has no CPU op"
    curves = m["lr_curves"]
    peak = max(curves["WarmupLR (linear)"])
    increment = [b - a for a, b in zip(curves["WarmupLR (linear)"][1:], curves["WarmupLR (linear)"][2:])][0]
    raw, shifted = m["schedule_mapping_max_abs_diff"], m["schedule_mapping_shifted_diff"]
    assert raw["linear vs WarmupDecayLR"] == pytest.approx(increment, rel=1e-6), "one step apart = one increment"
    assert shifted["linear vs WarmupDecayLR"] < 1e-12 and shifted["constant_with_warmup vs WarmupLR (linear)"] < 1e-12
    assert shifted["constant_with_warmup vs WarmupLR (log)"] > 0.05 * peak, "the log warm-up has another shape"
    assert curves["WarmupDecayLR"][-1] < 0.2 * peak and max(curves["OneCycle"]) == pytest.approx(peak)
    lr_range = curves["LRRangeTest"]
    assert all(b > a for a, b in zip(lr_range, lr_range[1:])), "LRRangeTest only grows"
