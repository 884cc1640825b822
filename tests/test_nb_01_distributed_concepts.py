"""Notebook 01 executed with papermill: identities from live ranks on 2 simulated nodes, the ring
all-reduce checked against dist.all_reduce, and its bytes against 2(N−1)/N·S."""
import pytest

from conftest import run_notebook

NAME = "01_distributed_concepts"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    assert m["multinode_world_size"] == 4
    ranks = sorted(m["multinode_ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [(r["node_rank"], r["local_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert m["backends"]["gloo"] is True
    assert "ok" in m["reduce_scatter_support"] or "all_reduce + slice" in m["reduce_scatter_support"]
    assert m["ring_matches_all_reduce"] is True
    assert m["ring_world_size"] == 4
    assert m["ring_bytes_expected"] > 0
    assert m["ring_bytes_per_rank"] == pytest.approx(m["ring_bytes_expected"], rel=0.01)
    times = m["all_reduce_times"]
    assert len(times) >= 4 and all(t["seconds"] > 0 for t in times)
    assert times[-1]["gbytes_per_s"] > times[0]["gbytes_per_s"], "large messages must move more bytes per second"
