"""Notebook 05 executed with papermill: the paper's example, DeepSpeed's estimators, buckets, the OOM ladder."""
import pytest

from conftest import run_notebook

NAME = "05_memory_planning"
pytestmark = pytest.mark.notebook


def test_planning_figures():
    m = run_notebook(NAME)
    gb = m["paper_example_gb"]
    assert gb["0"] == pytest.approx(120) and gb["1"] == pytest.approx(31.4, abs=0.05)
    assert gb["2"] == pytest.approx(16.6, abs=0.05) and gb["3"] == pytest.approx(1.9, abs=0.05)
    rows = m["estimator_rows"]
    assert {r["stage"] for r in rows} == {2, 3} and len({r["model"] for r in rows}) == 4
    assert m["bucket_dtype"] == "bf16"
    assert all(r["gpu_bytes"] > 0 for r in rows)
    assert abs(m["estimate_gap"]) < 0.05, "measured stage-3 bytes must agree with DeepSpeed's estimate's components"
    buckets = m["bucket_buffer_bytes"]
    small, large = sorted(buckets.items(), key=lambda kv: float(kv[0]))
    assert large[1] / small[1] == pytest.approx(float(large[0]) / float(small[0]), rel=0.01)
    assert m["first_fit"]["1 × 24 GB, 64 GB host, 2 TB NVMe"] == "ZeRO-Infinity: offload to NVMe"
