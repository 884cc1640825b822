"""Notebook 06 executed with papermill; the dtypes, overflows and loss-scale curve it measured asserted."""
import math

import pytest

from conftest import run_notebook
from course_utils import hardware

NAME = "06_mixed_precision"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    assert m["param_dtypes"] == {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    assert m["master_dtypes"] == {"fp32": "float32", "bf16": "float32"}, "master weights are fp32 in every precision"
    assert m["communication_dtypes"]["bf16"] == "bfloat16" and m["communication_dtypes"]["bf16+fp32 comm"] == "float32"
    if not hardware.detect().fp16:
        assert m["fp16_engine_error"] == "ValueError: Type fp16 is not supported on your device."
    trace = m["loss_scale_trace"]
    assert trace[0] == 2.0 ** 24, "the config starts dynamic scaling at 2^initial_scale_power"
    assert 3 <= m["fp16_skipped_steps"] < len(trace) - 5, "the too-high initial scale must overflow, then recover"
    assert all(math.log2(s).is_integer() for s in trace), "dynamic scaling only halves and doubles"
    assert min(trace) >= 1.0
    assert m["lr_trace"][0] == 0.0 and m["lr_trace"][-1] > 0, "the LR waits during skipped steps, then warms up"
    skipped = m["skipped_by_run"]
    assert skipped["static 16777216"] == len(trace) and skipped["static 1024"] == 0
    assert m["nan_pitfall"] == {"float32": True, "bfloat16": True, "float16": False}
