"""Notebook 05 executed with papermill: the paper's example, DeepSpeed's estimators, buckets, the OOM ladder."""
import pytest

from conftest import run_notebook
from course_utils.kernel.launch import memcap

NAME = "05_memory_planning"
pytestmark = pytest.mark.notebook


def expected_bucket_bytes(b: dict) -> float:
    """What DeepSpeed 0.19.8 allocates: stages 1-2 (setup_buckets) one reduce_bucket_size bucket, a second one
    with overlap_comm; stage 3 one bucket; none without contiguous_gradients; allgather_bucket_size: nothing."""
    if not b["contiguous_gradients"]:
        return 0
    copies = 2 if b["overlap_comm"] and b["stage"] in (1, 2) else 1
    return copies * b["reduce_bucket_size"] * (4 if b["dtype"] == "fp32" else 2)



def test_planning_figures():
    m = run_notebook(NAME)
    # the smoke run launches it too (about 20 s): rank 1 in a 400 MB memory cgroup, ended by the kernel's OOM killer
    if memcap.available():
        assert (m["oom_killed_rank"], m["oom_exit_signal"]) == (1, "SIGKILL")
    else:
        assert m["oom_killed_rank"] is None and m["oom_exit_signal"] is None
    assert all(r is None or "offload" in r for r in m["one_gpu_first_fit"].values()), "one GPU: an offload rung or nothing"
    gb = m["paper_example_gb"]
    assert gb["0"] == pytest.approx(120) and gb["1"] == pytest.approx(31.4, abs=0.05)
    assert gb["2"] == pytest.approx(16.6, abs=0.05) and gb["3"] == pytest.approx(1.9, abs=0.05)
    # real models counted on the meta device: Llama's shape written out (test_scale.llama_by_hand); a Mixtral layer's 8
    # experts are one module (gate_up_proj 8 × 2·14336 × 4096 and down_proj 8 × 4096 × 14336), gathered whole at ZeRO-3
    assert m["real_model_counts"]["Llama-3-8B shape"] == 8_030_261_248
    assert m["real_model_largest_layers"]["Mixtral-8x7B shape"] == 8 * 3 * 4096 * 14336
    assert {r["model"] for r in m["estimator_rows"]} >= {"GPT-2 XL", "Llama-3-8B shape", "Mixtral-8x7B shape"}
    for r in m["estimator_rows"]:     # the notebook's reading of DeepSpeed's estimators, without offload
        if not r["offload_optimizer"] and r["stage"] == 2:
            assert r["gpu_bytes"] == 2 * r["params"] + int(18 * r["params"] / r["gpus"]), r
        if not r["offload_optimizer"] and r["stage"] == 3 and r["zero_init"]:
            assert r["gpu_bytes"] == 4 * r["largest_layer_params"] + int(18 * r["params"] / r["gpus"]), r
    assert abs(m["estimate_gap"]) < 0.05, "measured stage-3 bytes must agree with DeepSpeed's estimate's components"
    buckets = m["buckets"]
    assert {(b["stage"], b["overlap_comm"], b["contiguous_gradients"]) for b in buckets} >= {
        (3, True, True), (3, True, False), (3, False, True), (2, False, True), (2, True, True), (1, True, True),
        (2, True, False)}
    for b in buckets:
        assert b["buffer_bytes"] == expected_bucket_bytes(b), b
        assert b["held_bytes"] == (b["buffer_bytes"] if b["stage"] == 3 else 0), "stages 1-2 free their buckets after backward"
    assert m["all_gather_into_tensor"] is True
    assert m["rule_vs_measured_gb"]["5e+08"][1] == pytest.approx(2.0), "5e8 bf16 buckets with overlap_comm: 2 × 5e8 × 2 B"
    assert m["first_fit"]["1 × 24 GB, 64 GB host, 2 TB NVMe"] == "ZeRO-Infinity: offload to NVMe"
    assert m["calculator_params"] == 7.5e9, "the calculator opens on the paper's 7.5 B parameters"
    # exercise 2, as DeepSpeed resolved the course's config: ZeRO-2 + optimizer offload, 4 × 8 × 2 ranks = 64
    assert m["plan_rung"] == [2, True, False, False]
    assert (m["plan_micro_batch"], m["plan_accumulation"]) == (4, 8)
    # one accounting along the ladder: on one GPU ZeRO-2 has nothing to partition, so it needs what no ZeRO needs
    ladder = m["one_gpu_ladder_gb"]
    assert ladder["ZeRO stage 2"] == ladder["+ gradient checkpointing"] < ladder["batch 1 + gradient accumulation"]
    assert ladder["ZeRO stage 3"] <= ladder["ZeRO stage 2"]
