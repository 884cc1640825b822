"""Notebook 01 executed with papermill: identities from live ranks on 2 simulated nodes and on 2 loopback hosts over
ssh, the collectives ZeRO calls, the ring all-reduce checked against dist.all_reduce, its bytes against 2(N−1)/N·S and its steps,
and a real model's gradient all-reduce projected on GPU links."""
import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.collectives import RingStep

NAME = "01_distributed_concepts"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    assert m["multinode_world_sizes"] == [4], "every rank of 2 nodes × 2 slots must see WORLD_SIZE 4"
    ranks = sorted(m["multinode_ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [(r["node_rank"], r["local_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the launcher's argument (launch.py) against its environment variable (LOCAL_RANK), both as the rank saw them
    assert all(r["argv"][0] == f"--local_rank={r['local_rank']}" for r in ranks)
    # over ssh: the smoke run leaves the launch out (tests/test_multinode.py launches it, and checks the notebook's table)
    assert m["ssh_launch"] is None and m["ssh_skipped"].startswith("the smoke run leaves this launch out")
    assert m["backends"]["gloo"] is True
    assert "ok" in m["reduce_scatter_support"] or "all_reduce + slice" in m["reduce_scatter_support"]

    zero = m["zero_collectives"]
    if m["world_size"] > 1:      # deepspeed 0.19: ZeRO-2 all-reduces its gradient buckets, ZeRO-3 reduce-scatters
        assert "all_reduce" in zero["2 backward"] and not any("reduce_scatter" in op for op in zero["2 backward"])
        assert any("reduce_scatter" in op for op in zero["3 backward"])
        assert any("all_gather" in op for op in zero["3 forward"])

    assert m["ring_matches_all_reduce"] is True
    n = m["ring_world_size"]
    assert n == 4
    assert m["ring_bytes_expected"] > 0
    assert m["ring_bytes_per_rank"] == pytest.approx(m["ring_bytes_expected"], rel=0.01)
    at = {(s.rank, s.step): s for s in as_records(m["ring_steps"], RingStep)}
    assert max(step for _, step in at) == 2 * (n - 1), "2(N−1) send/recv steps per rank"
    full = 2 ** n - 1
    for r in range(n):
        assert at[(r, 0)].held == [2.0 ** r] * n
        # after the scatter-reduce, rank r holds the complete sum of chunk (r+1) % N, and only that one
        assert [c for c, v in enumerate(at[(r, n - 1)].held) if v == full] == [(r + 1) % n]
        assert all(v == full for v in at[(r, 2 * (n - 1))].held)
        for k in range(1, 2 * n - 1):
            left = at[((r - 1) % n, k)]
            assert at[(r, k)].received == left.sent and left.sent_to == r
    times = m["all_reduce_times"]
    assert len(times) >= 4 and all(t["seconds"] > 0 for t in times)
    assert times[-1]["gbytes_per_s"] > times[0]["gbytes_per_s"], "large messages must move more bytes per second"
    alpha, beta = m["all_reduce_alpha_beta"]
    assert alpha > 0 and beta > 0, "a latency per call and a cost per byte"
    load = m["all_reduce_timing_load"]      # what else the machine ran while the ranks timed all_reduce
    assert load["wall_s"] > 0 and load["ranks_cpu_s"] > 0 and 0 <= load["others_cores"] <= load["cores"]
    check_the_ring_formula_and_the_projected_gradient_all_reduce(m)


def check_the_ring_formula_and_the_projected_gradient_all_reduce(m):
    """ring_sent against every rank's counted bytes (a formula off by more than its tolerance fails), then the all-reduce
    of a Llama-3-8B shape's bf16 gradients on 8 GPUs: this run's α per call, the ring's bytes at each link's rate."""
    agreement = m["scale_agreement"]
    assert len(agreement) == m["ring_world_size"] and all(r["within"] for r in agreement), agreement
    projections = m["scale_projections"]
    assert [p["hardware"] for p in projections] == ["8 × H100 80 GB", "8 × A100 40 GB", "8 × RTX 4090 24 GB",
                                                     "8 × H100 80 GB, one per machine"]
    alpha = m["all_reduce_alpha_beta"][0]
    for p in projections:
        latency, sent = p["terms"]
        assert latency["rate"] == pytest.approx(1 / alpha) and latency["count"] == 17     # 8.03e9 in buckets of 5e8
        assert sent["count"] == pytest.approx(2 * 7 / 8 * 2 * 8_030_261_248)              # 2(N−1)/N · 2 bytes · Ψ
        assert all(t["count"] > 0 and t["rate"] > 0 and t["rate_says"] for t in p["terms"])
        assert p["assumptions"]["link efficiency"] > 0 and p["assumptions"]["sources"] and p["assumptions"]["latency"]
        assert p["seconds"] == pytest.approx(latency["seconds"] + sent["seconds"])
    nvlink, pcie = projections[0]["terms"][1]["seconds"], projections[2]["terms"][1]["seconds"]
    assert nvlink < 0.15 < 0.5 < pcie, "the text: about a tenth of a second over NVLink, most of a second over PCIe"
