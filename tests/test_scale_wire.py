"""Bytes on the wire (notebooks 01 and 03): the ring and ZeRO formulas against counts written out by hand, the
agreement built from comms-logger messages written by hand, and the projections against hand-computed seconds."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from course_utils.common.records.collectives import Ring
from course_utils.kernel.scale import counts, models, project, wire
from course_utils.kernel.views.zero import comm_rows


def test_ring_sent_is_what_each_rank_sends_in_a_ring():
    # 4 ranks, a 1000-byte all_reduce: 2 × 3 chunks of 250 bytes
    assert counts.ring_sent("all_reduce", 1000, 4) == 1500
    # all_gather_into_tensor's message is this rank's 100-byte shard: it passes 3 of them on
    assert counts.ring_sent("all_gather_into_tensor", 100, 4) == 300
    # reduce_scatter_tensor's message is the whole 1000-byte input: 3 chunks of 250 leave the rank
    assert counts.ring_sent("reduce_scatter_tensor", 1000, 4) == 750
    with pytest.raises(ValueError, match="broadcast"):
        counts.ring_sent("broadcast", 1000, 4)


def test_zero_sent_by_stage_written_out():
    # Ψ = 1000 parameters of 2 bytes on 4 ranks; (N−1)/N = 3/4, Ψ·b = 2000 bytes
    assert counts.zero_sent(0, 1000, 4, 2) == 3000                   # all-reduce: 2 × 1500
    assert counts.zero_sent(1, 1000, 4, 2) == counts.zero_sent(2, 1000, 4, 2) == 4500   # + all-gather 1500
    assert counts.zero_sent(3, 1000, 4, 2, regather=False) == 3000   # gather once 1500, reduce-scatter 1500
    assert counts.zero_sent(3, 1000, 4, 2) == 4500                   # gathered again in backward: + 1500
    # 100 elements a second module uses are gathered again in forward and in backward: 2 × 100 × 2 × 3/4
    assert counts.zero_sent(3, 1000, 4, 2, reused=100) == 4800
    assert counts.zero_sent(3, 1000, 4, 2, regather=False, reused=100) == 3000   # kept whole: gathered once
    assert counts.zero_sent(1, 1000, 4, 2, reused=100) == 4500       # stages 0-2 gather nothing per use
    assert counts.zero_sent(3, 1000, 1, 2) == 0.0                    # one rank sends nothing


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)                     # 40 elements
        self.norm = torch.nn.LayerNorm(4)                           # 8
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight                        # tied: the head holds the same 40 again


def test_reused_numel_counts_a_tied_weight_once_more():
    assert wire.reused_numel(Tied()) == 40
    assert wire.reused_numel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))) == 0


def comms(label, stage, world, dtype, psi, owned, messages):
    return {"name": "comms", "rank": 0, "value": {"label": label, "stage": stage, "world_size": world, "dtype": dtype,
                                                  "num_params": psi, "owned_numel": owned, "messages": messages}}


def test_zero_agreement_from_comms_logger_messages_written_by_hand():
    psi = 1000                           # fp32, 2 ranks: 4000 bytes of gradients, 500-element partitions
    records = [
        comms("stage 1", 1, 2, "fp32", psi, 500, {"all_reduce": {"4000": 1, "4": 1}, "all_gather_into_tensor": {"2000": 1}}),
        comms("stage 3", 3, 2, "fp32", psi, 500, {"all_gather_into_tensor": {"2000": 1}, "reduce_scatter_tensor": {"4000": 1},
                                                  "broadcast": {"8": 3}}),
        # released after use, a 200-element weight held by two modules: its 100-element shard gathered twice more
        comms("stage 3, released after use", 3, 2, "fp32", psi, 500,
              {"all_gather_into_tensor": {"2000": 2, "400": 2}, "reduce_scatter_tensor": {"4000": 1}}),
    ]
    rows = wire.zero_agreement(comm_rows(records), reused=200)
    # sent on 2 ranks: stage 1 all-reduce 4000 × 2·½ + all-gather 2000 × 1 = 6000; stage 3 gather 2000 + reduce-scatter
    # 4000 × ½ = 4000; released: gathers (2 × 2000 + 2 × 400) × 1 + reduce-scatter 2000 = 6800
    assert [r["measured"] for r in rows] == pytest.approx([6000, 4000, 6800])
    assert [r["formula"] for r in rows] == pytest.approx([6000, 4000, 6800])
    assert all(r["within"] for r in rows)
    # without the second module's uses the formula misses the released run's extra gathers: 6000 against 6800
    assert not wire.zero_agreement(comm_rows(records), reused=0)[2]["within"]


def test_ring_agreement_fails_a_ring_that_sends_too_much():
    ring = dict(rank=0, matches=True, max_abs_diff=0.0, messages=6, tensor_bytes=4096, world_size=4, expected_bytes=0.0)
    assert wire.ring_agreement([Ring(bytes_sent=6144, **ring)])[0]["within"]            # 2 × 3/4 × 4096
    assert not wire.ring_agreement([Ring(bytes_sent=3 * 4096, **ring)])[0]["within"]    # everything to everyone


def size(params, **over):
    base = dict(name="toy", params=params, largest_param=params // 10, largest_layer=params // 10, embedding_params=0,
                expert_params=0, experts=0, top_k=0, layers=0, hidden=0, tokens_per_sample=1000)
    return models.Size(**{**base, **over})


def test_gradient_all_reduce_seconds_by_hand():
    p = wire.gradient_all_reduce(size(10**9), "H100 80 GB", alpha=1e-3, alpha_says="α = 1 ms")
    # 2e9 bytes of bf16 gradients, 8 GPUs: 2 × 7/8 × 2e9 = 3.5e9 bytes at 450 GB/s × 0.8; 2 buckets of 5e8 × 1 ms
    assert p.seconds == pytest.approx(3.5e9 / 360e9 + 2e-3)
    across = wire.gradient_all_reduce(size(10**9), "H100 80 GB", 1e-3, "α = 1 ms", across_machines=True)
    assert across.seconds == pytest.approx(3.5e9 / 40e9 + 2e-3)                 # one 50 GB/s port per GPU
    assert "one per machine" in across.hardware
    record = p.record()
    assert all(t["count"] > 0 and t["rate"] > 0 and t["rate_says"] for t in record["terms"])
    assert record["assumptions"]["link efficiency"] == 0.8 and record["assumptions"]["sources"]


def test_zero3_against_compute_by_hand():
    p8, p64 = wire.zero3_against_compute(size(10**9), [("H100 80 GB", 8), ("H100 80 GB", 64)], tokens_per_gpu=1000)
    compute = 3 * 2 * 1e9 * 1000 / (989e12 * 0.4)        # 6 FLOPs per parameter and token, no attention (0 layers)
    table = wire.hiding_table([p8, p64])
    assert table["compute (s)"].tolist() == pytest.approx([round(compute, 3)] * 2)
    share = table["collectives ÷ compute (overlap_comm must hide)"]
    assert share.iloc[0] == pytest.approx(3 * 7 / 8 * 2e9 / 360e9 / compute, abs=1e-3)      # over NVLink 4
    assert share.iloc[1] == pytest.approx(3 * 63 / 64 * 2e9 / 40e9 / compute, abs=1e-3)    # over the network
    assert table["left showing (s)"].iloc[0] == 0 and table["left showing (s)"].iloc[1] > 0
    assert "InfiniBand" in p64.assumptions["sources"][1] and "NVLink 4" in p8.assumptions["sources"][1]


def test_model_states_table_by_hand():
    table = wire.model_states_table(size(10**9, largest_layer=10**8), gpus=(1, 8))
    paper, estimator = "ZeRO paper (GB)", "DeepSpeed's estimator (GB)"
    assert table[(1, paper)].tolist() == [16.0] * 4                      # nothing to partition on one GPU
    assert table[(8, paper)].tolist() == [16.0, 5.5, 3.8, 2.0]           # 16Ψ, 4Ψ + 12Ψ/8, 2Ψ + 14Ψ/8, 16Ψ/8
    assert math.isnan(table[(8, estimator)][0]) and math.isnan(table[(8, estimator)][1])
    # stage 2: 2Ψ + 18Ψ/8 = 4.25 GB; stage 3: 4 × 10⁸ + 18Ψ/8 = 2.65 GB (the table rounds to 0.1 GB)
    assert table[(8, estimator)][2] == pytest.approx(4.25, abs=0.051)
    assert table[(8, estimator)][3] == pytest.approx(2.65, abs=0.051)


def test_the_bucket_is_deepspeeds_default():
    root = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0])     # read, not imported
    assert f"MEMORY_OPT_ALLREDUCE_SIZE = {wire.REDUCE_BUCKET}" in (root / "runtime/engine.py").read_text()
    assert f'"reduce_bucket_size": {wire.REDUCE_BUCKET}' in (root / "runtime/zero/config.py").read_text()


def test_assumptions_line_keeps_what_every_projection_shares():
    a = project.Projection("a", "x", [], {"MFU": 0.4, "GPUs": 8, "host": None})
    b = project.Projection("b", "y", [], {"MFU": 0.4, "GPUs": 64, "host": None})
    assert project.assumptions_line([a, b]) == "assumed: MFU 0.4"
