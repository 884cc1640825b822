"""Notebook 04 executed with papermill: the offload ladder, NVMe swap files, stage-3 knobs."""
import pytest

from conftest import run_notebook

NAME = "04_offload_and_infinity"
pytestmark = pytest.mark.notebook


def test_ladder_nvme_and_knobs_are_measured():
    m = run_notebook(NAME)
    ladder = {r["name"]: r for r in m["ladder"]}
    assert list(ladder) == ["stage 0", "stage 1", "stage 2", "stage 2 + offload", "stage 3", "stage 3 + offload"]
    assert all(r["step_seconds"] > 0 and r["peak_rss"] > 0 for r in ladder.values())
    assert m["memory_order_as_formula"] is True, "the measured memory order must follow the formula for this N"
    assert ladder["stage 2 + offload"]["host_bytes"] > 0 and ladder["stage 2"]["host_bytes"] == 0
    assert ladder["stage 3 + offload"]["device_bytes"] < 0.2 * ladder["stage 3"]["device_bytes"]
    assert ladder["stage 0"]["device_bytes"] > 1.5 * ladder["stage 3"]["device_bytes"]   # 16Ψ vs 16Ψ/N (20Ψ/N in fp32)
    assert m["nvme_swap_files"] >= 2
    assert m["client_optimizer_refused"] is True
    knobs = {r["name"]: r for r in m["knobs"]}
    assert len(knobs) == 4
    tight = knobs["knobs: tight (live 1e5, reuse 0, prefetch 0)"]
    persist = knobs["knobs: persist everything (threshold 1e7)"]
    assert persist["persistent_numel"] > 10 * tight["persistent_numel"]
    raised = knobs["knobs: the question's raise (live 3e10, reuse 1e10)"]
    assert raised["gathered_in_forward"] >= tight["gathered_in_forward"] > 0
